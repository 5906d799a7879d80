"""Request-path instruments: server TTFT (the GenAI semconv name), time per stage, and what the
engine looked like when the latest request arrived. Buckets are the GenAI convention's TTFT
boundaries (1 ms .. 10 s) extended to 1200 s: a request that waited on a cold start is measured in
minutes. TTFT and stage samples carry ``gen_ai.operation.name`` and ``gen_ai.provider.name``.

The TTFT record takes the request span's context, so SDKs with exemplars (trace-based filter, the
default) attach the trace id; the stage records do not (an exemplar costs a third of a record, and
the TTFT's already leads to the trace). Queue depth and KV usage at arrival are gauges read at
export time (per model: the latest arrival), so they cost no SDK call per request; the full
per-request values are attributes of each request span.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation

from otel_ttft import config, semconv
from otel_ttft.version import __version__


@cache
def _instruments() -> dict[str, Any]:
    meter = metrics.get_meter("otel_ttft.request", __version__,
                              meter_provider=config.current.meter_provider)
    return {
        "ttft": meter.create_histogram(
            semconv.METRIC_SERVER_TTFT, unit="s",
            description="Time to generate the first token, server side (arrival -> first token "
                        "handed to the HTTP layer)",
            explicit_bucket_boundaries_advisory=list(semconv.TTFT_BUCKETS_S)),
        "stage": meter.create_histogram(
            semconv.METRIC_REQUEST_STAGE_DURATION, unit="s",
            description="Time one request spent in one TTFT stage (frontend, queue, prefill; "
                        "first_decode is outside TTFT)",
            explicit_bucket_boundaries_advisory=list(semconv.TTFT_BUCKETS_S)),
        "waiting": meter.create_observable_gauge(
            semconv.METRIC_REQUEST_ARRIVAL_WAITING, callbacks=[_observe(0)], unit="{request}",
            description="Requests waiting in the engine queue when the latest request arrived"),
        "kv_usage": meter.create_observable_gauge(
            semconv.METRIC_REQUEST_ARRIVAL_KV_USAGE, callbacks=[_observe(1)], unit="1",
            description="Fraction of KV-cache blocks in use when the latest request arrived"),
    }


_NO_SPAN = Context()  # no current span: the trace-based exemplar filter offers nothing

# model -> (waiting requests, KV usage) at the latest arrival
_latest: dict[str | None, list[float | None]] = {}


def _observe(index: int):
    def callback(options: CallbackOptions):
        for model, values in list(_latest.items()):
            if values[index] is not None:
                yield Observation(values[index],
                                  {semconv.GEN_AI_REQUEST_MODEL: model} if model else {})

    return callback


def reset() -> None:
    """Instruments are made again from the next sample on (``instrument()`` with a provider)."""
    _instruments.cache_clear()


def record_request(ttft_s: float | None, stages: dict[str, float], model: str | None, cold: bool,
                   waiting: int | None, kv_usage: float | None,
                   context: Context | None = None,
                   operation: str = semconv.GEN_AI_OPERATION_TEXT_COMPLETION) -> None:
    """One finished request: TTFT, one sample per stage, and the engine state at arrival."""
    inst = _instruments()
    if waiting is not None or kv_usage is not None:
        _latest[model] = [waiting, kv_usage]
    if ttft_s is not None:
        inst["ttft"].record(ttft_s, _attrs(model, cold, None, operation), context=context)
    stage_hist = inst["stage"]
    for stage, seconds in stages.items():  # no exemplar (a third of a record's cost): the
        stage_hist.record(seconds, _attrs(model, cold, stage, operation),  # TTFT has one
                          context=_NO_SPAN)


@cache
def _attrs(model: str | None, cold: bool, stage: str | None, operation: str) -> dict[str, Any]:
    """One attribute dict per combination, built once (the SDK copies what it keeps)."""
    out: dict[str, Any] = {semconv.ATTR_REQUEST_COLD: cold,
                           semconv.GEN_AI_OPERATION_NAME: operation,
                           semconv.GEN_AI_PROVIDER_NAME: semconv.GEN_AI_PROVIDER_VLLM}
    if model:
        out[semconv.GEN_AI_REQUEST_MODEL] = model
    if stage:
        out[semconv.ATTR_STAGE] = stage
    return out
