"""OTel instruments. Created lazily against the configured (else the global) meter provider, with
explicit buckets far above 10 s (a cold start of a large model takes minutes; SDK defaults stop at
10 s).

Activations are rare (one an hour or a day), so besides the histogram each stage's duration in the
process's latest activation is a gauge read at export time: an alert compares that value with the
model's history (``collector-config/rules``) instead of a rate over windows with no samples.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.context import process as this_process
from otel_ttft.version import __version__


def meter(name: str = "otel_ttft", provider: Any = None) -> Any:
    """A meter of ours on ``provider``, default: the one in force (``config.meter_provider``)."""
    return metrics.get_meter(name, __version__, meter_provider=provider if provider is not None
                             else config.current.meter_provider)


def reset() -> None:
    """Instruments are made again from the next sample on (``instrument()`` with a provider)."""
    _instruments.cache_clear()


@cache
def _instruments() -> dict[str, Any]:
    ours = meter()
    return {
        "activation": ours.create_histogram(
            semconv.METRIC_ACTIVATION_STAGE_DURATION, unit="s",
            description="Duration of one engine-activation stage span (start, wake, adapter load)",
            explicit_bucket_boundaries_advisory=list(semconv.ACTIVATION_DURATION_BUCKETS_S)),
        "read_bytes": ours.create_counter(
            semconv.METRIC_LOAD_READ_BYTES, unit="By",
            description="Checkpoint bytes read while loading weights"),
        "read_throughput": ours.create_histogram(
            semconv.METRIC_LOAD_READ_THROUGHPUT, unit="GBy/s",
            description="Checkpoint read throughput per shard",
            explicit_bucket_boundaries_advisory=list(semconv.THROUGHPUT_BUCKETS_GB_PER_S)),
        "last": ours.create_observable_gauge(
            semconv.METRIC_ACTIVATION_STAGE_LAST_DURATION, callbacks=[_observe_last], unit="s",
            description="Duration of each stage in this process's latest activation (its longest "
                        "span of that stage)"),
        "compile_hits": ours.create_observable_gauge(
            semconv.METRIC_ACTIVATION_COMPILE_CACHE_HIT_RATIO, callbacks=[_observe_compile],
            unit="1", description="Fraction of torch.compile spans in this process's latest "
                                  "activation that loaded their artifacts from the cache"),
    }


# (stage, model) -> [trace id of the activation, longest span of that stage in it, seconds]
_last: dict[tuple[str, str | None], list] = {}


# model -> [trace id of the activation, compile spans, cache hits]
_compiles: dict[str | None, list] = {}


def _model(model: str | None) -> str | None:
    """A stage that ended before this process knew its model (its process start, say) belongs to
    the model it serves: read at export time, when it is known, so the series of one activation
    all carry the model label."""
    return model or this_process.served_model


def _observe_last(options: CallbackOptions):
    merged: dict[tuple[str, str | None], float] = {}
    for (stage, model), (_trace, seconds) in list(_last.items()):
        key = (stage, _model(model))
        merged[key] = max(seconds, merged.get(key, 0.0))
    for (stage, model), seconds in merged.items():
        yield Observation(seconds, _attrs(stage, model))


def _observe_compile(options: CallbackOptions):
    for model, (_trace, total, hits) in list(_compiles.items()):
        if total:
            yield Observation(hits / total, _attrs(None, _model(model)))


def _attrs(stage: str | None, model: str | None) -> dict[str, str]:
    out = {}
    if stage:
        out[semconv.ATTR_STAGE] = stage
    if model:
        out[semconv.GEN_AI_REQUEST_MODEL] = model
    return out


def record_activation_stage(stage: str, seconds: float, model: str | None,
                            trace_id: int | None = None, cache_hit: bool | None = None) -> None:
    """One finished stage span. ``trace_id`` (the activation's trace) lets the latest-activation
    gauges start afresh when a new activation (a wake-up) begins in this process; ``cache_hit``
    is a torch.compile span's ``ttft.compile.cache_hit``."""
    _instruments()["activation"].record(seconds, _attrs(stage, model))
    if cache_hit is not None:
        compiles = _compiles.get(model)
        if compiles is None or compiles[0] != trace_id:
            compiles = _compiles[model] = [trace_id, 0, 0]
        compiles[1] += 1
        compiles[2] += bool(cache_hit)
    entry = _last.get((stage, model))
    if entry is None or entry[0] != trace_id:
        _last[(stage, model)] = [trace_id, seconds]
    elif seconds > entry[1]:
        entry[1] = seconds


def record_shard_read(nbytes: int, gb_per_s: float | None, model: str | None) -> None:
    inst = _instruments()
    attrs = _attrs(semconv.STAGE_LOAD_READ, model)
    inst["read_bytes"].add(nbytes, attrs)
    if gb_per_s is not None:
        inst["read_throughput"].record(gb_per_s, attrs)
