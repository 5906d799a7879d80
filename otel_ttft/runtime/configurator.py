"""The configurator ``opentelemetry-instrument`` runs in every vLLM process: the SDK's providers and
exporters from the ``OTEL_*`` settings, built through the SDK's public constructors.

It builds what the SDK's own configurator would (resource, sampler and span limits from the
environment, one batch processor per ``OTEL_TRACES_EXPORTER``, one periodic reader per
``OTEL_METRICS_EXPORTER``) with three differences, each a public parameter or class:

- ``shutdown_on_exit=False`` on both providers, and our bounded exit instead
  (``telemetry.bounded_export``): a dead collector never holds a model switch;
- each exporter is wrapped to count what it could not send (``ttft.telemetry.dropped``), and our
  start-up span processors (``telemetry.pipeline``: stage tagging; ``inflight``: the in-flight
  tracker) come first on the tracer provider;
- span and trace ids come from a generator seeded by the OS (``PrivateIdGenerator``), not from
  Python's global ``random``, which vLLM seeds in every engine process (the SDK's default
  generator would give every process the same ids). ``OTEL_PYTHON_ID_GENERATOR`` still wins.

Logs are not configured (``OTEL_LOGS_EXPORTER``): the SDK's logs API is not public yet.

Where ``opentelemetry-instrument`` ran another configurator (``opentelemetry-distro`` installed
beside us registers one, ``configurator``, and which is found first depends on the install), our
instrumentor calls ``adopt_foreign``: our span processors join that SDK tracer provider through its
public ``add_span_processor`` and its id generator is replaced (a public attribute), so stage
tagging, the in-flight tracker and the live verdict stay on; one WARNING names what is still lost
and the one setting that restores it (``distro.RESTORE``, handed in).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from otel_ttft.runtime import inflight
from otel_ttft.runtime.hooks import activation_ledger
from otel_ttft.runtime.telemetry import bounded_export, pipeline

logger = logging.getLogger("otel_ttft")


class PrivateIdGenerator(IdGenerator):
    """Random ids from a generator of its own, seeded by the OS and again in a forked child."""

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(32))
        os.register_at_fork(after_in_child=lambda: self._random.seed(os.urandom(32)))

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


def _names(environ: Mapping[str, str], variable: str, default: str) -> list[str]:
    raw = environ.get(variable, default)
    return [n.strip() for n in raw.split(",") if n.strip() and n.strip().lower() != "none"]


def _entry_point(group: str, name: str, signal: str, environ: Mapping[str, str]) -> Any:
    """The class an exporter name stands for; ``otlp`` picks gRPC or HTTP by the protocol
    setting, as the SDK's configurator does."""
    if name == "otlp":
        protocol = (environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                    or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        name = "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"
    found = entry_points(group=group, name=name)
    if not found:
        raise RuntimeError(f"no {group} entry point named {name!r}: is its package installed?")
    return next(iter(found)).load()


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return max(0, int(environ.get(name, "") or default))
    except ValueError:
        return default


_DELTA = {Counter, ObservableCounter, Histogram}


def metric_preferences(environ: Mapping[str, str]) -> tuple[dict, dict]:
    """Temporality and histogram aggregation from ``OTEL_EXPORTER_OTLP_METRICS_*``, as the OTLP
    specification defines them: given to the exporter and to our wrapper around it alike."""
    choice = environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "").strip().lower()
    delta = {"delta": _DELTA, "lowmemory": {Counter, Histogram}}.get(choice, set())
    kinds = (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter,
             ObservableGauge)
    temporality = {k: AggregationTemporality.DELTA if k in delta
                   else AggregationTemporality.CUMULATIVE for k in kinds}
    aggregation = {}
    if environ.get("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "").strip() \
            == "base2_exponential_bucket_histogram":
        aggregation = {Histogram: ExponentialBucketHistogramAggregation()}
    return temporality, aggregation


def _metric_reader(cls: Any, environ: Mapping[str, str],
                   built: bounded_export.Pipeline) -> MetricReader:
    if isinstance(cls, type) and issubclass(cls, MetricReader):  # a pull reader (Prometheus)
        return cls()
    temporality, aggregation = metric_preferences(environ)
    try:
        inner = cls(preferred_temporality=temporality, preferred_aggregation=aggregation)
    except TypeError:  # an exporter without those parameters: not counted
        return PeriodicExportingMetricReader(cls())
    counted = bounded_export.CountingMetricExporter(inner, temporality, aggregation)
    built.metric_exporters.append(counted)
    return PeriodicExportingMetricReader(counted)


def build(environ: Mapping[str, str] | None = None, *,
          span_exporters: list[SpanExporter] | None = None,
          metric_readers: list[MetricReader] | None = None,
          span_processor: type = BatchSpanProcessor) -> bounded_export.Pipeline:
    """Providers and exporters from the ``OTEL_*`` settings, or the exporters and readers given
    (a program that embeds vLLM, the tests); installs nothing globally."""
    environ = os.environ if environ is None else environ
    resource = Resource.create()
    id_name = environ.get("OTEL_PYTHON_ID_GENERATOR", "random").strip()
    id_generator = (PrivateIdGenerator() if id_name in ("", "random")
                    else _entry_point("opentelemetry_id_generator", id_name, "", environ)())
    tracer_provider = TracerProvider(resource=resource, id_generator=id_generator,
                                     shutdown_on_exit=False)
    built = bounded_export.Pipeline(tracer_provider, None, queue_capacity=_int(
        environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048) + _int(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                                                          512))
    # Ours first, ahead of any exporting processor: a snapshot of a span is always queued
    # before the span itself (``inflight``), and the tagger's stage is on a span before export.
    tagger = pipeline.StageTagger()
    tracer_provider.add_span_processor(tagger)
    tracer_provider.add_span_processor(inflight.install())
    ledger = activation_ledger.install()  # the live verdict's stage spans
    if ledger is not None:
        tracer_provider.add_span_processor(ledger)
    tracer_provider.add_span_processor(built.counter)
    if span_exporters is None:
        span_exporters = [_entry_point("opentelemetry_traces_exporter", name, "traces", environ)()
                          for name in _names(environ, "OTEL_TRACES_EXPORTER", "otlp")]
    for exporter in span_exporters:
        counted = bounded_export.CountingSpanExporter(exporter, tagger.restamp)
        processor = span_processor(counted)
        tracer_provider.add_span_processor(processor)
        built.span_exporters.append(counted)
        built.exporting.append(processor)
    readers = metric_readers if metric_readers is not None else [
        _metric_reader(_entry_point("opentelemetry_metrics_exporter", name, "metrics", environ),
                       environ, built)
        for name in _names(environ, "OTEL_METRICS_EXPORTER", "otlp")]
    built.meter_provider = MeterProvider(resource=resource, metric_readers=readers,
                                         shutdown_on_exit=False)
    return built


def configure(environ: Mapping[str, str] | None = None,
              **given: Any) -> bounded_export.Pipeline | None:
    """Build (``given``: as ``build`` takes them), install as the global providers, and take
    over the exit; ``None`` where ``OTEL_SDK_DISABLED`` is true."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    built = build(environ, **given)
    trace.set_tracer_provider(built.tracer_provider)
    metrics.set_meter_provider(built.meter_provider)
    bounded_export.adopt(built)
    return built


_adopted: list[Any] = []  # the foreign providers our processors joined (one per process)


def adopt_foreign(provider: Any, configurator_name: str | None, restore: str,
                  environ: Mapping[str, str] | None = None) -> list[str] | None:
    """Our processors on a tracer provider that another configurator installed (the global one,
    under ``opentelemetry-instrument``), and one WARNING line naming the setting that restores
    the rest (``restore``: ``distro.RESTORE``); what was added, or ``None`` where there was
    nothing to join (no SDK provider: the line says so). Once per process.

    Through the SDK's public means only: ``add_span_processor`` puts ours after the exporting
    processors already there (a span's stage is still tagged at its start, which is all the
    analysis and the live verdict read), and ``id_generator`` is replaced where it is the SDK's
    default, which draws from the global ``random`` that vLLM seeds alike in every engine
    process. Lost: the bounded exit (the provider shuts down as the SDK does at exit), drop
    counts, and the restamping of vLLM's spans after a wall-clock step (our exporter wrapper)."""
    environ = os.environ if environ is None else environ
    name = repr(configurator_name) if configurator_name else (
        f"none (OTEL_PYTHON_CONFIGURATOR={environ.get('OTEL_PYTHON_CONFIGURATOR', '')!r} names no "
        "installed one)")
    if not isinstance(provider, TracerProvider):
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true":
            logger.warning("otel-ttft: opentelemetry-instrument ran configurator %s, not ours, and "
                           "no SDK tracer provider is installed: no spans, no live verdict; set "
                           "%s to restore them", name, restore)
        return None
    if any(p is provider for p in _adopted):
        return []
    _adopted.append(provider)
    added = ["stage tagging", "in-flight tracker"]
    provider.add_span_processor(pipeline.StageTagger())
    provider.add_span_processor(inflight.install())
    ledger = activation_ledger.install()
    if ledger is not None:
        provider.add_span_processor(ledger)
        added.append("live verdict ledger")
    id_name = environ.get("OTEL_PYTHON_ID_GENERATOR", "random").strip()
    if id_name in ("", "random") and type(getattr(provider, "id_generator", None)) \
            is RandomIdGenerator:
        provider.id_generator = PrivateIdGenerator()
        added.append("private ids")
    logger.warning(
        "otel-ttft: opentelemetry-instrument ran configurator %s, not ours; added to its "
        "provider: %s; still lost: the bounded exit and drop counts; set %s to restore them",
        name, ", ".join(added), restore)
    return added
