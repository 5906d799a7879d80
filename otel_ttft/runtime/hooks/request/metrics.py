"""Request-path instruments, recorded for every request, span or not (vLLM's own histograms split
neither cold from warm nor TTFT into stages): server TTFT (GenAI buckets extended to 1200 s: a
request that waited on a cold start takes minutes; its sample takes the request span's context,
for the exemplar), the seconds spent per stage (a counter summed here, read at export) and the
engine at the latest arrival (gauges).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from opentelemetry.context import Context, get_current
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_ttft import semconv
from otel_ttft.runtime.telemetry.metrics import observable, stop_feeding

_MAX_KEYS = 1024  # (model, cold, operation) combinations kept; LoRA names come and go

NO_SPAN = Context()
"""A context without a span: the trace-based exemplar filter offers nothing (a request without
a span of its own has no trace to lead to)."""


class RequestMetrics:
    """The request path's instruments, and what its observable ones read (registered once per
    meter provider and fed by the open part, as ``telemetry.metrics.observable`` says why)."""

    def __init__(self, config: Any, meter: Meter) -> None:
        # model -> (waiting requests, KV usage) at the latest arrival
        self.latest: dict[str | None, tuple[float | None, float | None]] = {}
        # (model, cold, operation) -> stage -> seconds, since this process started counting
        self.stage_time: dict[tuple[str | None, bool, str], dict[str, float]] = {}
        self.ttft = meter.create_histogram(
            semconv.METRIC_SERVER_TTFT, unit="s",
            description="Time to generate the first token, server side (arrival -> first token "
                        "handed to the HTTP layer)",
            explicit_bucket_boundaries_advisory=list(semconv.TTFT_BUCKETS_S))
        self.sources = (self._observe_stage_time, self._observe_latest(0),
                        self._observe_latest(1))
        self.feeds = (
            observable(config, semconv.METRIC_REQUEST_STAGE_TIME, self.sources[0], counter=True,
                       unit="s", description="Time requests spent in each TTFT stage (frontend, "
                       "queue, prefill; first_decode is outside TTFT), summed over requests"),
            observable(config, semconv.METRIC_REQUEST_ARRIVAL_WAITING, self.sources[1],
                       unit="{request}", description="Requests waiting in the engine queue when "
                       "the latest request arrived"),
            observable(config, semconv.METRIC_REQUEST_ARRIVAL_KV_USAGE, self.sources[2],
                       unit="1", description="Fraction of KV-cache blocks in use when the "
                       "latest request arrived"))

    def close(self) -> None:
        """The observable instruments read nothing from now on."""
        for feed, source in zip(self.feeds, self.sources, strict=True):
            stop_feeding(feed, source)
        self.latest.clear()
        self.stage_time.clear()

    def _observe_latest(self, index: int) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def callback(options: CallbackOptions) -> Iterator[Observation]:
            for model, values in list(self.latest.items()):
                if values[index] is not None:
                    yield Observation(values[index],
                                      {semconv.GEN_AI_REQUEST_MODEL: model} if model else {})

        return callback

    def _observe_stage_time(self, options: CallbackOptions) -> Iterator[Observation]:
        for (model, cold, operation), sums in list(self.stage_time.items()):
            for stage, seconds in list(sums.items()):
                yield Observation(seconds, _attrs(model, cold, stage, operation))

    def record(self, ttft_s: float | None, stages: dict[str, float], model: str | None,
               cold: bool, waiting: int | None, kv_usage: float | None,
               context: Context | None = None,
               operation: str = semconv.GEN_AI_OPERATION_TEXT_COMPLETION) -> None:
        """One finished request: its TTFT sample, its time per stage, the engine state at
        arrival. ``context``: the request span's, for the exemplar (``None``: the current
        one)."""
        if waiting is not None or kv_usage is not None:
            self.latest[model] = (waiting, kv_usage)
        if ttft_s is not None:
            self.ttft.record(ttft_s, _attrs(model, cold, None, operation),
                             context=context if context is not None else get_current())
        if stages:
            key = (model, cold, operation)
            sums = self.stage_time.get(key)
            if sums is None:
                if len(self.stage_time) >= _MAX_KEYS:
                    self.stage_time.clear()  # a counter reset, as after a restart
                sums = self.stage_time[key] = {}
            for stage, seconds in stages.items():
                sums[stage] = sums.get(stage, 0.0) + seconds


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
