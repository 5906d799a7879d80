"""Telemetry never slows vLLM down, whatever the collector does. The SDK's own exit flushes with
each exporter's timeout and retries (10 s and more per process with the collector down, added to
every restart-style model switch); our configurator's providers skip it, and :func:`bounded_exit`
shuts both down in parallel until ``OTEL_TTFT_EXIT_TIMEOUT_MS``. What did not go is counted
(``ttft.telemetry.dropped``: spans in, :class:`SpanCounter`, less spans out,
:class:`CountingSpanExporter`), logged once, and abandoned. A provider we did not build keeps the
SDK's own exit (``docs/failures.md``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import get_meter
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.version import __version__

logger = logging.getLogger("otel_ttft")


# --- what got lost ---
class Drops:
    """What one pipeline could not send: (signal, reason) -> items, counted in
    ``ttft.telemetry.dropped`` on the pipeline's meter provider; the first loss is logged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}
        self.counter: Any = None  # the instrument, made when the pipeline is adopted

    def make_counter(self, meter_provider: Any) -> None:
        if self.counter is None and meter_provider is not None:
            self.counter = get_meter("otel_ttft", __version__, meter_provider=meter_provider) \
                .create_counter(
                semconv.METRIC_TELEMETRY_DROPPED, unit="{item}",
                description="Spans and metric points this process could not send (collector "
                            "down, slow, or the exit deadline passed)")

    def count(self, signal: str, reason: str, n: int, detail: str = "") -> None:
        """``n`` items lost; the first loss of the pipeline is logged."""
        if n <= 0:
            return
        with self.lock:
            first = not self.counts
            self.counts[(signal, reason)] = self.counts.get((signal, reason), 0) + n
        if self.counter is not None:
            with contextlib.suppress(Exception):
                self.counter.add(n, {semconv.ATTR_TELEMETRY_SIGNAL: signal,
                                     semconv.ATTR_TELEMETRY_DROP_REASON: reason})
        if first:
            logger.warning("otel-ttft: telemetry is not reaching the collector (%s: %s%s); it "
                           "is dropped and counted in %s, and this is logged once per process",
                           signal, reason, f", {detail}" if detail else "",
                           semconv.METRIC_TELEMETRY_DROPPED)

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self.lock:
            return dict(self.counts)


# --- counting on the way in and out ---
class SpanCounter(SpanProcessor):
    """Counts the sampled spans handed to export (placed ahead of the batch processors)."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        if span.context.trace_flags.sampled:
            self.ended += 1


class CountingSpanExporter(SpanExporter):
    """Delegates to the user's exporter (each span through ``restamp`` first: vLLM's spans onto
    our clock, ``pipeline.StageTagger``); counts what it sent and what failed; after the exit
    deadline, gives up at once."""

    def __init__(self, inner: SpanExporter,
                 restamp: Callable[[ReadableSpan], ReadableSpan] | None = None) -> None:
        self.inner = inner
        self.restamp = restamp
        self.seen = 0  # spans handed to it (sent or failed)
        self.closed = False  # past the exit deadline: counted there, fail fast
        self.drops = Drops()  # the pipeline's, once adopted

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.closed:
            return SpanExportResult.FAILURE
        if self.restamp is not None:
            spans = [self.restamp(s) for s in spans]
        result, detail = _attempt(lambda: self.inner.export(spans), SpanExportResult.FAILURE,
                                  self.inner)
        if not self.closed:  # else the deadline passed during this send: counted there
            self.seen += len(spans)
            if result is not SpanExportResult.SUCCESS:
                self.drops.count("spans", semconv.DROP_EXPORT_FAILED, len(spans), detail)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class CountingMetricExporter(MetricExporter):
    """Delegates to the user's metric exporter and counts the points of failed exports. Built
    with the same preferences as the exporter it wraps (``configurator``)."""

    def __init__(self, inner: MetricExporter, preferred_temporality: dict | None,
                 preferred_aggregation: dict | None) -> None:
        super().__init__(preferred_temporality=preferred_temporality,
                         preferred_aggregation=preferred_aggregation)
        self.inner = inner
        self.in_flight = 0
        self.closed = False
        self.drops = Drops()  # the pipeline's, once adopted

    def export(self, metrics_data: Any, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        n = _points(metrics_data)
        if self.closed:
            return MetricExportResult.FAILURE
        self.in_flight = n
        result, detail = _attempt(
            lambda: self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
            MetricExportResult.FAILURE, self.inner)
        self.in_flight = 0
        if result is not MetricExportResult.SUCCESS and not self.closed:
            self.drops.count("metrics", semconv.DROP_EXPORT_FAILED, n, detail)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _points(data: Any) -> int:
    return sum(len(getattr(m.data, "data_points", ()) or ())
               for rm in getattr(data, "resource_metrics", ()) for sm in rm.scope_metrics
               for m in sm.metrics)


def _attempt(export: Callable[[], Any], failure: Any, exporter: Any) -> tuple[Any, str]:
    """``export()``'s result (``failure`` if it raised), and what the first-loss log line
    says of it: the exception, else the exporter's endpoint where it has one."""
    try:
        result = export()
    except Exception as exc:  # noqa: BLE001 - the SDK would log and drop it too
        return failure, repr(exc)
    endpoint = getattr(exporter, "endpoint", None)  # not every exporter says
    return result, f"endpoint {endpoint}" if isinstance(endpoint, str) else ""


# --- the pipeline our configurator built ---
@dataclass
class Pipeline:
    """What ``runtime.configurator`` built: the providers, the processors that send spans
    somewhere (the in-flight tracker sends its snapshots through them), and the counters."""

    tracer_provider: Any
    meter_provider: Any
    exporting: list[SpanProcessor] = field(default_factory=list)
    span_exporters: list[CountingSpanExporter] = field(default_factory=list)
    metric_exporters: list[CountingMetricExporter] = field(default_factory=list)
    counter: SpanCounter = field(default_factory=SpanCounter)
    queue_capacity: int = 2048 + 512
    """Spans a batch processor can hold (its queue and the batch in flight): what an exporter
    never saw beyond this was dropped as the queue overflowed."""
    drops: Drops = field(default_factory=Drops)


class _Exit:
    """The one bounded exit of this process (an exit handler is process-wide): the pipeline it
    shuts down, what runs first (``callbacks``: the open parts' and, for now, ``request.settle``'s)
    and its deadline (``timeout_s``: the instrumented config's while instrumented)."""

    pipeline: Pipeline | None = None
    callbacks: list[Callable[[], None]] = []
    timeout_s: float = config.Config().exit_timeout_s
    lock = threading.Lock()
    state = "armed"  # -> "registered" (atexit) -> "done"


def adopt(pipeline: Pipeline) -> None:
    """Our configurator's pipeline: bounded exit, drop counting, snapshot export."""
    _Exit.pipeline = pipeline
    for exporter in (*pipeline.span_exporters, *pipeline.metric_exporters):
        exporter.drops = pipeline.drops
    with contextlib.suppress(Exception):  # made now: at exit the provider may be shutting down
        pipeline.drops.make_counter(pipeline.meter_provider)
    with _Exit.lock:
        if _Exit.state != "armed":
            return
        _Exit.state = "registered"
    # vLLM's processes end with the root logger at ERROR: our two lines (first drop, exit
    # summary) would vanish. A level set on "otel_ttft" by the user still wins.
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    atexit.register(bounded_exit)


def exporting_processors() -> list[SpanProcessor]:
    """The processors of our configurator's provider that send spans somewhere; none for a
    provider we did not build."""
    return list(_Exit.pipeline.exporting) if _Exit.pipeline is not None else []


def before_exit_flush(callback: Callable[[], None]) -> None:
    """Run ``callback()`` at exit before the final flush (open spans are ended, waiting requests
    emitted, so they are exported). A part registers when it is made and takes it back when it
    closes (``forget_before_exit_flush``)."""
    if callback not in _Exit.callbacks:
        _Exit.callbacks.append(callback)


def forget_before_exit_flush(callback: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        _Exit.callbacks.remove(callback)


def bounded_exit(timeout_s: float | None = None) -> None:
    """Callbacks first, then both providers shut down in parallel until the deadline; what did
    not go is counted and logged. Runs once."""
    with _Exit.lock:
        if _Exit.state == "done":
            return
        _Exit.state = "done"
    budget = _Exit.timeout_s if timeout_s is None else timeout_s
    start = time.monotonic()
    for callback in _Exit.callbacks:
        with contextlib.suppress(Exception):
            callback()
    p = _Exit.pipeline
    if p is None:
        return
    threads = {}
    for signal, provider in (("spans", p.tracer_provider), ("metrics", p.meter_provider)):
        threads[signal] = t = threading.Thread(target=_quietly, args=(provider.shutdown,),
                                               name=f"otel-ttft-exit-{signal}", daemon=True)
        t.start()
    for t in threads.values():
        t.join(max(0.0, start + budget - time.monotonic()))
    late = {signal for signal, t in threads.items() if t.is_alive()}
    for exporter in p.span_exporters:
        exporter.closed = True
        unsent = p.counter.ended - exporter.seen
        stuck = min(unsent, p.queue_capacity) if "spans" in late else 0
        p.drops.count("spans", semconv.DROP_QUEUE_FULL, unsent - stuck)
        p.drops.count("spans", semconv.DROP_EXIT_DEADLINE, stuck)
    for exporter in p.metric_exporters:
        exporter.closed = True
        if "metrics" in late:
            p.drops.count("metrics", semconv.DROP_EXIT_DEADLINE, exporter.in_flight)
    counts = p.drops.snapshot()
    if counts:
        logger.warning("otel-ttft: pid %d exits after %.0f ms of final flush; not delivered: %s",
                       os.getpid(), (time.monotonic() - start) * 1000, ", ".join(
                           f"{n} {sig} ({reason})" for (sig, reason), n in sorted(counts.items())))


class _OncePerMessage(logging.Filter):
    """The SDK logs every failed attempt of every batch: thousands of lines an hour with the
    collector down. Each distinct message passes once per process; our count says the rest."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


class BoundedExit:
    """The ``bounded_exit`` part: while instrumented, the exit's deadline is the instrumented
    config's (``OTEL_TTFT_EXIT_TIMEOUT_MS``), and, with our configurator's pipeline, one filter
    (``_OncePerMessage``) is on every OpenTelemetry logger made so far (the configurator imported
    the exporters). Closing it puts the deadline back and takes the filter off each logger."""

    def __init__(self, process_state: Any) -> None:
        self.filter = _OncePerMessage()
        self.loggers: list[logging.Logger] = []
        self.previous_timeout_s = _Exit.timeout_s
        _Exit.timeout_s = process_state.config.exit_timeout_s
        if _Exit.pipeline is None:
            return  # a provider we did not build: its logs are its owner's business
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("opentelemetry."):
                log = logging.getLogger(name)
                log.addFilter(self.filter)
                self.loggers.append(log)

    def close(self) -> None:
        for log in self.loggers:
            log.removeFilter(self.filter)
        self.loggers.clear()
        _Exit.timeout_s = self.previous_timeout_s


PART = "bounded_exit"


def _quietly(fn: Callable[[], Any]) -> None:
    with contextlib.suppress(Exception):
        fn()

