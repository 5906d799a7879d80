"""The stage tagger: the span processor our configurator puts first on the tracer provider it
builds (with ``runtime.inflight``'s tracker). A provider we did not build gets neither, so
uninstrumenting leaves it as it was."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import Span

from otel_ttft import semconv
from otel_ttft.runtime import clock, ranks
from otel_ttft.runtime.telemetry import metrics

_ACTIVATION_FAMILIES = (semconv.STAGE_LOAD, semconv.STAGE_WARMUP, semconv.STAGE_SWITCH)


class StageTagger(SpanProcessor):
    """Tags vLLM's own start-up spans with ``ttft.stage`` as they open (one dict lookup per span
    start: we build on vLLM's spans instead of duplicating them) and feeds the stage metrics as
    any staged span ends. vLLM stamps its spans with the wall clock, ours with the monotonic
    one: a wall-clock step is noted as each time is taken, and our exporter wrapper moves the
    span onto our clock on its way out (``restamp``)."""

    def __init__(self) -> None:
        self.shifts: dict[int, list[int]] = {}  # span id -> [start shift, end shift], in ns

    def _shift(self, span: Any, index: int, wall_ns: int | None) -> None:
        if wall_ns is None or not _made_by_vllm(span):
            return
        shift = clock.from_wall_ns(wall_ns) - wall_ns
        if shift:  # zero unless the wall clock stepped since our offset was measured
            if len(self.shifts) > 10_000:  # spans that never reached an exporter
                self.shifts.clear()
            self.shifts.setdefault(span.get_span_context().span_id, [0, 0])[index] = shift

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        stage = semconv.VLLM_SPAN_STAGES.get(span.name)
        if stage is not None and span.is_recording():
            self._shift(span, 0, getattr(span, "start_time", None))
            span.set_attribute(semconv.ATTR_STAGE, stage)
            part = metrics.open_part()  # the instrumentation's, with the process identity
            if part is not None and part.identity.kind:
                span.set_attribute(semconv.ATTR_PROCESS_KIND, part.identity.kind)
            worker_ranks = ranks.span_attributes()
            if worker_ranks:
                span.set_attributes(worker_ranks)

    def restamp(self, span: ReadableSpan) -> ReadableSpan:
        """``span`` on our clock, if it is a vLLM span whose times the wall clock moved."""
        shift = self.shifts.pop(span.context.span_id, None) if self.shifts else None
        if shift is None:
            return span
        return ReadableSpan(
            name=span.name, context=span.context, parent=span.parent, resource=span.resource,
            attributes=span.attributes, events=span.events, links=span.links, kind=span.kind,
            status=span.status, start_time=(span.start_time or 0) + shift[0],
            end_time=(span.end_time or 0) + shift[1],
            instrumentation_scope=span.instrumentation_scope)

    def on_end(self, span: ReadableSpan) -> None:
        if span.name in semconv.VLLM_SPAN_STAGES:
            self._shift(span, 1, span.end_time)
        attrs = span.attributes or {}
        stage = attrs.get(semconv.ATTR_STAGE)
        if stage is None or span.end_time is None or span.start_time is None:
            return
        part = metrics.open_part()
        if part is not None and semconv.stage_family(str(stage)) in _ACTIVATION_FAMILIES:
            part.record_activation_stage(str(stage), (span.end_time - span.start_time) / 1e9,
                                         part.identity.served_model, span.context.trace_id,
                                         attrs.get(semconv.ATTR_COMPILE_CACHE_HIT))


def _made_by_vllm(span: Any) -> bool:
    """A span of vLLM's tracers (scope ``vllm.*``, its times on the wall clock); where vLLM has
    none we open spans of the same names, on our clock."""
    name = getattr(getattr(span, "instrumentation_scope", None), "name", "") or ""
    return name == "vllm" or name.startswith("vllm.")
