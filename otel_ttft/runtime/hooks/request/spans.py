"""Builds one request's span tree and metric samples from its recorded timestamps.

The request span goes through the tracer as usual (sampling, ids, processors' ``on_start``). Its
children are finished before they are made, so where the SDK allows it they are handed straight
to the request span's processor as ``ReadableSpan`` objects: about 3 us each instead of 13 us
through ``start_span``. Any other provider gets them through the public API. Whether the
children are built at all is the request-detail policy's call (``detail``); the request span always
carries the stage durations. A request span without children that goes only to the API server's
export process is built there (``span_facts`` here, ``remote.build`` there).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, ids
from otel_ttft.runtime.hooks import activation_verdict
from otel_ttft.runtime.hooks.request import detail as request_detail
from otel_ttft.runtime.hooks.request import first_use
from otel_ttft.runtime.hooks.request import metrics as request_metrics
from otel_ttft.runtime.hooks.request.attributes import operation_name, span_attributes
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.hooks.request.timeline import (
    PREEMPTED,
    Segment,
    stage_durations,
    tile,
)
from otel_ttft.runtime.telemetry import finished, spans

logger = logging.getLogger("otel_ttft")

try:
    from opentelemetry.sdk.trace import ReadableSpan
except ImportError:  # pragma: no cover - the SDK ships with vLLM
    ReadableSpan = None  # type: ignore[assignment,misc]

_fast_ok = True  # turned off for good if the fast path ever fails


def ns(mono_s: float) -> int:
    return clock.monotonic_to_epoch_ns(mono_s)


class Children:
    """Finished child spans of one recording parent span."""

    def __init__(self, parent: Any):
        self.parent_ctx = parent.get_span_context()
        self.proc = finished.processor_of(parent) if _fast_ok else None
        if isinstance(parent, finished.FinishedSpan):
            self.resource, self.scope = parent.maker.resource, parent.maker.scope
            self.context = trace.set_span_in_context(trace.NonRecordingSpan(self.parent_ctx))
        else:
            self.resource, self.scope = parent.resource, parent.instrumentation_scope
            self.context = trace.set_span_in_context(parent)

    def add(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any],
            parent_ctx: SpanContext | None = None) -> SpanContext:
        """One finished child (of ``parent_ctx``, default: the parent span); its context."""
        global _fast_ok
        parent_ctx = parent_ctx or self.parent_ctx
        if self.proc is not None and ReadableSpan is not None:
            try:
                span_id = ids.new_span_id()
                ctx = SpanContext(parent_ctx.trace_id, span_id, False, parent_ctx.trace_flags,
                                  parent_ctx.trace_state)
                self.proc.on_end(ReadableSpan(
                    name, ctx, parent_ctx, self.resource, dict(attributes),
                    kind=SpanKind.INTERNAL, start_time=start_ns, end_time=max(end_ns, start_ns),
                    instrumentation_scope=self.scope))
                return ctx
            except Exception as exc:  # noqa: BLE001 - an SDK we do not know: use the public API
                _fast_ok = False
                self.proc = None
                logger.info("otel-ttft: fast child spans unavailable (%r); using the tracer", exc)
        ctx_parent = (self.context if parent_ctx is self.parent_ctx
                      else trace.set_span_in_context(trace.NonRecordingSpan(parent_ctx)))
        span = spans.tracer().start_span(name, context=ctx_parent, start_time=start_ns,
                                         attributes=attributes)
        span.end(end_time=max(end_ns, start_ns))
        return span.get_span_context()


def parent_context(trace_headers: Mapping[str, str] | None,
                   current: otel_context.Context | None
                   ) -> tuple[SpanContext | None, otel_context.Context | None, SpanKind]:
    """The request span's parent: the current (HTTP server) span if there is one, else the
    caller's ``traceparent``, else none; the context it is in, where there is one (the common
    ``traceparent`` is parsed to a span context alone); SERVER unless a local server span already
    exists."""
    # A ``Context`` is a dict: an empty one (no HTTP server span: the usual case) holds no span.
    if current:
        parent = trace.get_current_span(current).get_span_context()
        if parent.is_valid:
            return parent, current, SpanKind.INTERNAL
    if trace_headers:
        parent = _parse_traceparent(trace_headers)
        if parent is not None:
            return parent, None, SpanKind.SERVER
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        ctx = TraceContextTextMapPropagator().extract(
            {k: v for k, v in trace_headers.items() if k in ("traceparent", "tracestate")})
        parent = trace.get_current_span(ctx).get_span_context()
        return (parent if parent.is_valid else None), ctx, SpanKind.SERVER
    return None, None, SpanKind.SERVER


def _parse_traceparent(headers: Mapping[str, str]) -> SpanContext | None:
    """The common case (version 00, no tracestate) without the propagator's regex; else None."""
    value = headers.get("traceparent")
    if not value or "tracestate" in headers or len(value) != 55 or not value.startswith("00-"):
        return None
    try:
        trace_id, span_id, flags = int(value[3:35], 16), int(value[36:52], 16), int(value[53:], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or value[35] != "-" or value[52] != "-":
        return None
    return SpanContext(trace_id, span_id, True, TraceFlags(flags & 1))


def emit_tree(*, parent: SpanContext | None, context: otel_context.Context | None,
              kind: SpanKind, start: float, end: float,
              segments: list[Segment], first_decode: tuple[float, float] | None,
              warmup: list[Warmup], attributes: dict[str, Any],
              events: list[tuple[str, float, dict[str, Any]]], links: list[Link],
              error: str | None, detail: str | None = semconv.DETAIL_ALL) -> trace.Span:
    """The request span and, when ``detail`` says why (else only for the sampled share: see
    ``detail``), its stage children, all finished; returns the request span.

    ``warmup`` holds (span name, stage, start, end, attributes) paid inside this request
    (adapter load, compile, a front-end cache filled): each becomes a child of the stage segment
    it started in.
    """
    span = finished.start_finished(semconv.SPAN_REQUEST, parent=parent, context=context,
                                   kind=kind, start_time=ns(start), links=links)
    if not span.is_recording():
        span.end(end_time=ns(end))
        return span
    return _finish(span, end, segments, first_decode, warmup, attributes, events, error, detail)


def _finish(span: Any, end: float, segments: list[Segment],
            first_decode: tuple[float, float] | None, warmup: list[Warmup],
            attributes: dict[str, Any], events: list[tuple[str, float, dict[str, Any]]],
            error: str | None, detail: str | None) -> trace.Span:
    made = fill(span, segments, first_decode, warmup, attributes, events, error, detail)
    made.end(end_time=ns(end))
    if isinstance(made, finished.FinishedSpan):
        return trace.NonRecordingSpan(made.get_span_context())
    return made


def fill(span: Any, segments: list[Segment], first_decode: tuple[float, float] | None,
          warmup: list[Warmup], attributes: dict[str, Any],
          events: list[tuple[str, float, dict[str, Any]]], error: str | None,
          detail: str | None) -> Any:
    """The request span's attributes, events and status, and its children; ends nothing."""
    span.set_attributes(attributes)
    for name, ts, attrs in events:
        span.add_event(name, attrs, timestamp=ns(ts))
    if detail is None:
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        return span
    span.set_attribute(semconv.ATTR_REQUEST_DETAIL, detail)
    kids = Children(span)
    pending = sorted(warmup, key=lambda w: w[2])
    for seg in segments:
        attrs: dict[str, Any] = {semconv.ATTR_STAGE: seg.stage}
        if seg.stage == semconv.STAGE_FRONTEND:
            attrs[semconv.ATTR_FRONTEND_PHASE] = (
                "input" if seg.name == semconv.SPAN_REQUEST_INPUT else "output")
        ctx = kids.add(seg.name, ns(seg.start), ns(seg.end), attrs)
        while pending and seg.start <= pending[0][2] <= seg.end:
            name, stage, w_start, w_end, w_attrs = pending.pop(0)
            kids.add(name, ns(w_start), ns(w_end), {semconv.ATTR_STAGE: stage, **w_attrs},
                     parent_ctx=ctx)
    for name, stage, w_start, w_end, w_attrs in pending:  # outside every segment: the request's
        kids.add(name, ns(w_start), ns(w_end), {semconv.ATTR_STAGE: stage, **w_attrs})
    if first_decode is not None:
        kids.add(semconv.SPAN_REQUEST_FIRST_DECODE, ns(first_decode[0]), ns(first_decode[1]),
                 {semconv.ATTR_STAGE: semconv.STAGE_FIRST_DECODE})
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    return span


ASK: Any = object()
"""``emit_request``'s ``detail`` when the caller did not ask the policy yet (it remembers each
request's TTFT for the tail: asked once per request)."""


def emit_request(rec: RequestRecord, now: float, detail: str | None = ASK) -> None:
    """The request's span tree and metric samples (its hooks' failure rule applies);
    ``detail``: the policy's answer for it, where already asked."""
    end = now
    rec.read_payload()
    eng = rec.engine
    queued = rec.queued if rec.queued is not None or eng is None else eng.queued
    own = rec.schedule_events()
    schedule = own or (eng.schedule if eng is not None else [])
    if rec.first_tok is not None and not own:
        for kind, ts in schedule:
            if kind == PREEMPTED and ts >= rec.first_tok:
                rec.late_preemptions = [*rec.late_preemptions, ts]
    ttft_end = None
    if rec.first_tok is not None:
        # The first chunk written to the client if we saw it, else the API process got it.
        ttft_end = rec.recv
        flushed = rec.first_flush() if rec.streaming else None
        if flushed is not None:
            ttft_end = max(flushed, rec.recv)
    ttft = (ttft_end - rec.arrival) if ttft_end is not None else None
    first_decode = ((rec.first_tok, rec.second_tok)
                    if rec.first_tok is not None and rec.second_tok is not None else None)
    # Rejected on arrival: nothing ran, so no stage tiles its (absent) TTFT.
    stages = ({} if ttft is None or rec.rejected is not None
              else stage_durations(rec.arrival, queued, schedule, rec.first_tok, ttft_end))
    if first_decode is not None:
        stages[semconv.STAGE_FIRST_DECODE] = first_decode[1] - first_decode[0]
    # This request's own front-end work: the fills that began before EngineCore queued it.
    fills = first_use.within(rec.arrival, next(
        t for t in (queued, rec.first_tok, ttft_end, end) if t is not None))
    warmup = _warmup_spans(eng, fills)
    if warmup:
        rec.cold = True  # it waited for warm-up work (a compile, its adapter's load, a cache)
    error = rec.rejected or rec.error
    headers = rec.trace_headers
    # whoever traces the request, if anyone
    caller, context, kind = parent_context(
        headers if headers and "traceparent" in headers else None, rec.context)
    if detail is ASK:
        detail = request_detail.reason(cold=rec.cold, ttft=ttft,
                                       failed=bool(error or rec.aborted), model=rec.model)
    # Drawn when it arrived where it could have gone without a record (``api``); one made at
    # its end from vLLM's stats was not drawn: the draw already gave the share its records.
    if detail is None and (rec.sampled or (not rec.from_stats and request_detail.sampled(
            caller.trace_id if caller else None))):
        detail = semconv.DETAIL_SAMPLED
    ctx = request_metrics.NO_SPAN
    # vLLM's own tracing on (``rec.vllm``): the user asked for a span per request; ours is it.
    traced = (caller is not None and caller.trace_flags.sampled) or rec.vllm is not None
    if request_detail.wants_span(detail, traced=traced):
        span_end = max(end, ttft_end or end)
        span = finished.start_finished(semconv.SPAN_REQUEST, parent=caller, context=context,
                                       kind=kind, start_time=ns(rec.arrival),
                                       links=activation_links(rec))
        if not span.is_recording():
            span.end(end_time=ns(span_end))
        elif (detail is None and not config.current.capture_content
              and isinstance(span, finished.FinishedSpan) and span.ships()
              and (facts := span_facts(rec, eng, caller, ns(span_end), ttft, schedule, stages,
                                       fills, error, span.maker.limits)) is not None):
            span.ship(BUILDER, facts)  # built in the export process (``remote``)
            span = trace.NonRecordingSpan(span.get_span_context())
        else:
            segments = ([] if rec.rejected is not None or detail is None  # no children
                        else tile(rec.arrival, queued, schedule, rec.first_tok, ttft_end, end))
            span = _finish(span, span_end, segments, first_decode, warmup,
                           span_attributes(rec, eng, ttft, schedule, stages, fills),
                           preemption_events(rec, schedule), error, detail)
        if span.get_span_context().is_valid:
            ctx = trace.set_span_in_context(span)
    usage = (1.0 - eng.free / eng.total) if eng is not None and eng.total else None
    request_metrics.record_request(ttft, stages, rec.model, rec.cold,
                                   eng.waiting if eng is not None else None, usage,
                                   context=ctx, operation=operation_name(rec.ext_id))
    activation_verdict.request_done(rec.activation, rec.cold_index, ttft, stages, warmup)


BUILDER = "otel_ttft.runtime.hooks.request.remote:build"
"""What the export process calls to build a shipped request span (``span_wire.WireTree``)."""
FACTS_VERSION = 1
_MASK64 = (1 << 64) - 1  # msgpack's integers are 64 bits: a trace id goes in two
_encode_facts = msgspec.msgpack.Encoder().encode


def span_facts(rec: RequestRecord, eng: EnginePayload | None, parent: SpanContext | None,
               end_ns: int, ttft: float | None, schedule: list[tuple[str, float]],
               stages: dict[str, float], fills: list[Any], error: str | None,
               limits: Any) -> bytes | None:
    """A request span's makings, for ``remote.build`` in the export process: what
    ``span_attributes``, ``preemption_events`` and ``activation_links`` read of the record and
    the payload, the parent, the end, the status and the span limits in force, as one flat
    msgpack array (one C call). ``None`` where a value does not encode (vLLM's own attributes
    of another type, say): the span is then built here."""
    act = rec.activation
    link = getattr(act, "span_context", None) if act is not None else None
    lora = rec.lora
    try:  # a value msgpack does not take: built here instead
        return _encode_facts((
            FACTS_VERSION, clock.EPOCH_OFFSET_NS,
            (limits.max_span_attributes, limits.max_attribute_length, limits.max_events,
             limits.max_event_attributes, limits.max_links),
            None if parent is None else (parent.span_id, parent.is_remote),
            rec.ext_id, rec.arrival, end_ns, rec.vllm, rec.model, rec.prompt_len, rec.out_tokens,
            rec.cached, rec.params, None if rec.finish is None else str(rec.finish), ttft,
            rec.queue is not None or rec.taken, rec.streaming, rec.aborted, rec.rejected,
            None if lora is None else (lora.lora_name, lora.lora_int_id),
            None if act is None else (act.kind, act.ready_ns, None if link is None else (
                link.trace_id >> 64, link.trace_id & _MASK64, link.span_id, int(link.trace_flags))),
            rec.cold_index, rec.cold, rec.first_tok, rec.late_preemptions, rec.preemptions,
            None if eng is None else (eng.queued, eng.waiting, eng.running, eng.free, eng.total,
                                      eng.attempts, eng.schedule, eng.adapter, eng.compile),
            schedule, stages, fills, error))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None


def preemption_events(rec: RequestRecord, schedule: list[tuple[str, float]]
                       ) -> list[tuple[str, float, dict[str, Any]]]:
    events = [(semconv.EVENT_REQUEST_PREEMPTED, ts, {semconv.ATTR_EVENT_BEFORE_FIRST_TOKEN: True})
              for kind, ts in schedule if kind == PREEMPTED
              and (rec.first_tok is None or ts < rec.first_tok)]
    events += [(semconv.EVENT_REQUEST_PREEMPTED, ts, {semconv.ATTR_EVENT_BEFORE_FIRST_TOKEN: False})
               for ts in rec.late_preemptions]
    return events


def activation_links(rec: RequestRecord) -> list[Link]:
    act = rec.activation
    if act is not None and getattr(act, "span_context", None) is not None \
            and act.span_context.is_valid:
        return [Link(act.span_context, {semconv.ATTR_LINK_KIND: semconv.LINK_KIND_ACTIVATION,
                                        semconv.ATTR_ACTIVATION_KIND: act.kind})]
    return []


Warmup = tuple[str, str, float, float, dict[str, Any]]  # span name, stage, start, end, attrs


def _warmup_spans(eng: EnginePayload | None, fills: list[first_use.Fill] = ()
                  ) -> list[Warmup]:
    out: list[Warmup] = [(semconv.SPAN_FIRST_USE, semconv.STAGE_WARMUP_FIRST_USE, s, e,
                          {semconv.ATTR_FIRST_USE_CACHE: label}) for s, e, label in fills]
    if eng is None:
        return out
    out += [(semconv.SPAN_TORCH_COMPILE, semconv.STAGE_WARMUP_COMPILE, s, e, {})
            for s, e in eng.compile]
    if eng.adapter is not None:
        out.append((semconv.SPAN_ADAPTER_LOAD, semconv.STAGE_WARMUP_ADAPTER, *eng.adapter, {}))
    return out
