"""OTel instruments. Created lazily against the global meter provider, with explicit buckets far
above 10 s (a cold start of a large model takes minutes; SDK defaults stop at 10 s)."""

from __future__ import annotations

from functools import cache
from typing import Any

from opentelemetry import metrics

from otel_ttft import semconv
from otel_ttft.version import __version__


@cache
def _instruments() -> dict[str, Any]:
    meter = metrics.get_meter("otel_ttft", __version__)
    return {
        "activation": meter.create_histogram(
            semconv.METRIC_ACTIVATION_STAGE_DURATION, unit="s",
            description="Duration of one engine-activation stage span (start, wake, adapter load)",
            explicit_bucket_boundaries_advisory=list(semconv.ACTIVATION_DURATION_BUCKETS_S)),
        "read_bytes": meter.create_counter(
            semconv.METRIC_LOAD_READ_BYTES, unit="By",
            description="Checkpoint bytes read while loading weights"),
        "read_throughput": meter.create_histogram(
            semconv.METRIC_LOAD_READ_THROUGHPUT, unit="GBy/s",
            description="Checkpoint read throughput per shard",
            explicit_bucket_boundaries_advisory=list(semconv.THROUGHPUT_BUCKETS_GB_PER_S)),
    }


def _attrs(stage: str | None, model: str | None) -> dict[str, str]:
    out = {}
    if stage:
        out[semconv.ATTR_STAGE] = stage
    if model:
        out[semconv.GEN_AI_REQUEST_MODEL] = model
    return out


def record_activation_stage(stage: str, seconds: float, model: str | None) -> None:
    _instruments()["activation"].record(seconds, _attrs(stage, model))


def record_shard_read(nbytes: int, gb_per_s: float | None, model: str | None) -> None:
    inst = _instruments()
    attrs = _attrs(semconv.STAGE_LOAD_READ, model)
    inst["read_bytes"].add(nbytes, attrs)
    if gb_per_s is not None:
        inst["read_throughput"].record(gb_per_s, attrs)
