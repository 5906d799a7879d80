"""One request's span tree and metric samples, built after the fact from its recorded timestamps
with explicit start and end times (as vLLM's own ``do_tracing``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks import first_use
from otel_ttft.runtime.hooks.request.attributes import (
    named_waits,
    operation_name,
    preemption_events,
    span_attributes,
)
from otel_ttft.runtime.hooks.request.detail import DetailPolicy
from otel_ttft.runtime.hooks.request.metrics import NO_SPAN, RequestMetrics
from otel_ttft.runtime.hooks.request.payload import CompileTime, EnginePayload
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.hooks.request.timeline import (
    PREEMPTED,
    Segment,
    first_scheduled,
    stage_durations,
    tile,
)


def ns(mono_s: float) -> int:
    return clock.monotonic_to_epoch_ns(mono_s)


def _child(tracer: trace.Tracer, name: str, parent: trace.Span, start_ns: int, end_ns: int,
           attributes: Mapping[str, Any]) -> trace.Span:
    """One finished child of ``parent``."""
    span = tracer.start_span(name, context=trace.set_span_in_context(parent),
                                     start_time=start_ns, attributes=attributes)
    span.end(end_time=max(end_ns, start_ns))
    return span


def parent_context(trace_headers: Mapping[str, str] | None,
                   current: otel_context.Context | None
                   ) -> tuple[SpanContext | None, otel_context.Context, SpanKind]:
    """The request span's parent: the current (HTTP server) span if there is one, else the
    caller's ``traceparent``, else none (an empty context: a root); the context it is in; SERVER
    unless a local server span already exists."""
    # A ``Context`` is a dict: an empty one (no HTTP server span: the usual case) holds no span.
    if current:
        parent = trace.get_current_span(current).get_span_context()
        if parent.is_valid:
            return parent, current, SpanKind.INTERNAL
    if trace_headers:
        ctx = TraceContextTextMapPropagator().extract(
            {k: v for k, v in trace_headers.items() if k in ("traceparent", "tracestate")})
        parent = trace.get_current_span(ctx).get_span_context()
        return (parent if parent.is_valid else None), ctx, SpanKind.SERVER
    return None, otel_context.Context(), SpanKind.SERVER


def _fill(tracer: trace.Tracer, span: trace.Span, segments: list[Segment],
          first_decode: tuple[float, float] | None, warmup: list[Warmup]) -> None:
    """The request span's stage children: segments that tile its TTFT, the warm-up paid inside
    it under the segment that holds its middle (a wait that starts when the request was
    scheduled belongs to Prefill, not to the Queue that ends there), and ``first_decode``."""
    pending = sorted(warmup, key=lambda w: w[2] + w[3])
    for seg in segments:
        attrs: dict[str, Any] = {semconv.ATTR_STAGE: seg.stage}
        if seg.stage == semconv.STAGE_FRONTEND:
            attrs[semconv.ATTR_FRONTEND_PHASE] = (
                "input" if seg.name == semconv.SPAN_REQUEST_INPUT else "output")
        child = _child(tracer, seg.name, span, ns(seg.start), ns(seg.end), attrs)
        while pending and seg.start <= (pending[0][2] + pending[0][3]) / 2 <= seg.end:
            name, stage, w_start, w_end, w_attrs = pending.pop(0)
            _child(tracer, name, child, ns(w_start), ns(w_end),
                   {semconv.ATTR_STAGE: stage, **w_attrs})
    for name, stage, w_start, w_end, w_attrs in pending:  # outside every segment: the request's
        _child(tracer, name, span, ns(w_start), ns(w_end), {semconv.ATTR_STAGE: stage, **w_attrs})
    if first_decode is not None:
        _child(tracer, semconv.SPAN_REQUEST_FIRST_DECODE, span, ns(first_decode[0]),
               ns(first_decode[1]), {semconv.ATTR_STAGE: semconv.STAGE_FIRST_DECODE})


class RequestEmitter:
    """Emits finished requests with the API server part's tracer, instruments and detail
    policy."""

    def __init__(self, tracer: trace.Tracer, metrics: RequestMetrics,
                 detail: DetailPolicy, fills: Any, verdict: Any) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.detail = detail
        self.fills = fills  # the front end's first-use fills (``first_use.FirstUse``)
        self.verdict = verdict  # the live verdict (``activation_verdict.LiveVerdict``)

    def close(self) -> None:
        self.metrics.close()

    def emit(self, rec: RequestRecord, now: float) -> None:
        """The request's span tree (where the policy wants one) and its metric samples (every
        request: the cold/warm split of TTFT and time per stage is ours, vLLM's histograms have
        neither)."""
        end = now
        eng = rec.engine
        queued = rec.queued if rec.queued is not None or eng is None else eng.queued
        schedule = rec.schedule or (list(eng.schedule) if eng is not None else [])
        ttft_end = None
        if rec.first_tok is not None:
            # The first chunk written to the client if we saw it, else the API process got it.
            ttft_end = rec.recv if rec.recv is not None else rec.first_tok
            flushed = rec.first_flush() if rec.streaming else None
            if flushed is not None:
                ttft_end = max(flushed, ttft_end)
        ttft = (ttft_end - rec.arrival) if ttft_end is not None else None
        # This request's own front-end work: the fills that began before EngineCore queued it.
        fills = self.fills.within(rec.arrival, next(
            t for t in (queued, rec.first_tok, ttft_end, end) if t is not None))
        warmup = _warmup_spans(eng, fills)
        was_cold = rec.cold  # among the first after its activation, before warm-up says so
        if warmup:
            rec.cold = True  # it waited for warm-up work (a compile, its adapter's load, a cache)
        error = rec.rejected or rec.error
        headers = rec.trace_headers
        caller, context, kind = parent_context(
            headers if headers and "traceparent" in headers else None, rec.context)
        policy = self.detail
        detail = policy.reason(cold=rec.cold, ttft=ttft, failed=bool(error or rec.aborted),
                               model=rec.model)
        if detail is None and policy.sampled(caller.trace_id if caller else None):
            detail = semconv.DETAIL_SAMPLED
        # vLLM's own tracing on (``rec.vllm``): the user asked for a span per request; ours is it.
        traced = (caller is not None and caller.trace_flags.sampled) or rec.vllm is not None
        wanted = policy.wants_span(detail, traced=traced)
        if rec.first_tok is not None and not rec.schedule:
            rec.late_preemptions += [ts for kind_, ts in schedule
                                     if kind_ == PREEMPTED and ts >= rec.first_tok]
        first_decode = ((rec.first_tok, rec.second_tok)
                        if rec.first_tok is not None and rec.second_tok is not None else None)
        # Rejected on arrival: nothing ran, so no stage tiles its (absent) TTFT.
        stages = ({} if ttft is None or rec.rejected is not None
                  else stage_durations(rec.arrival, queued, schedule, rec.first_tok, ttft_end))
        if first_decode is not None:
            stages[semconv.STAGE_FIRST_DECODE] = first_decode[1] - first_decode[0]
        uncached = (self._uncached_prefix(rec, eng, was_cold, schedule, stages)
                    if eng is not None and eng.prefix is not None else None)
        if uncached is not None:
            warmup.append(uncached.span)
        ctx = NO_SPAN
        if wanted:
            span = self.tracer.start_span(semconv.SPAN_REQUEST, context=context, kind=kind,
                                          start_time=ns(rec.arrival),
                                          links=activation_links(rec))
            if span.is_recording():
                span.set_attributes(span_attributes(rec, eng, ttft, schedule, stages, fills))
                if uncached is not None:
                    span.set_attributes(uncached.attributes)
                for name, ts, attrs in preemption_events(rec, schedule):
                    span.add_event(name, attrs, timestamp=ns(ts))
                if detail is not None:
                    span.set_attribute(semconv.ATTR_REQUEST_DETAIL, detail)
                    if rec.rejected is None:
                        waits = wait_spans(eng, rec.first_tok, first_scheduled(schedule))
                        _fill(self.tracer, span, tile(rec.arrival, queued, schedule,
                                                      rec.first_tok, ttft_end, end),
                              first_decode, warmup + waits)
                if error:
                    span.set_status(Status(StatusCode.ERROR, error))
            span.end(end_time=ns(max(end, ttft_end or end)))
            if span.get_span_context().is_valid:
                ctx = trace.set_span_in_context(span)
        usage = (1.0 - eng.free / eng.total) if eng is not None and eng.total else None
        self.metrics.record(ttft, stages, rec.model, rec.cold,
                            eng.waiting if eng is not None else None, usage,
                            context=ctx, operation=operation_name(rec.ext_id))
        if rec.cold_index:
            self.verdict.request_done(
                rec.activation, rec.cold_index, ttft, stages, warmup,
                prompt_tokens=rec.prompt_len, cached_tokens=rec.cached,
                uncached_prefix_tokens=uncached.tokens if uncached is not None else 0,
                prefix=uncached.prefix if uncached is not None else None)

    def _uncached_prefix(self, rec: RequestRecord, eng: EnginePayload, cold: bool,
                         schedule: list[tuple[str, float]], stages: dict[str, float]
                         ) -> UncachedPrefix | None:
        """The prefix-cache baseline sees the request's block hashes (what it found cached);
        for a cold one, the prefill of the prompt tokens whose prefix warm requests had found
        cached before the activation and this request computed: ``prefill.uncached_prefix``,
        at the start of its prefill (time linear in the tokens computed, as ``analyze``)."""
        prefix = eng.prefix
        seen = self.verdict.prefix_seen(rec.activation, cold, rec.prompt_len, rec.cached,
                                        prefix.hashes, prefix.tokens)
        if seen is None or not seen.tokens or not rec.prompt_len or rec.cached is None:
            return None
        tokens = min(seen.tokens, rec.prompt_len) - rec.cached
        computed = rec.prompt_len - rec.cached
        prefill = stages.get(semconv.STAGE_PREFILL, 0.0)
        start = first_scheduled(schedule)
        if tokens <= 0 or computed <= 0 or prefill <= 0 or start is None:
            return None
        seconds = prefill * tokens / computed
        attrs = {semconv.ATTR_REQUEST_UNCACHED_PREFIX_TOKENS: tokens}
        return UncachedPrefix(
            tokens, seen.prefix, (semconv.SPAN_PREFILL_UNCACHED_PREFIX,
                                  semconv.STAGE_PREFILL_UNCACHED_PREFIX, start, start + seconds,
                                  attrs),
            {**attrs, semconv.ATTR_REQUEST_UNCACHED_PREFIX_SECONDS: seconds})


def activation_links(rec: RequestRecord) -> list[Link]:
    act = rec.activation
    if act is not None and getattr(act, "span_context", None) is not None \
            and act.span_context.is_valid:
        return [Link(act.span_context, {semconv.ATTR_LINK_KIND: semconv.LINK_KIND_ACTIVATION,
                                        semconv.ATTR_ACTIVATION_KIND: act.kind})]
    return []


Warmup = tuple[str, str, float, float, dict[str, Any]]  # span name, stage, start, end, attrs


@dataclass(frozen=True, slots=True)
class UncachedPrefix:
    """A cold request's prefill of a prefix that was cached before its activation."""

    tokens: int
    prefix: str | None  # its deepest known block: which prefix (a hash, never text)
    span: Warmup  # the child span under Prefill, as warm-up work is placed
    attributes: dict[str, Any]  # on the request span


def _warmup_spans(eng: EnginePayload | None, fills: list[first_use.Fill] = ()
                  ) -> list[Warmup]:
    out: list[Warmup] = [(semconv.SPAN_FIRST_USE, semconv.STAGE_WARMUP_FIRST_USE, s, e,
                          {semconv.ATTR_FIRST_USE_CACHE: label}) for s, e, label in fills]
    if eng is None:
        return out
    # vLLM's model compiled in a step (start-up skipped its warm-up) is the model's compile;
    # anything else Dynamo compiled there is what serving alone reached
    out += [(semconv.SPAN_TORCH_COMPILE, semconv.STAGE_WARMUP_COMPILE if c.model_graph
             else semconv.STAGE_WARMUP_STEP_COMPILE, c.start, c.end, compile_evidence(c))
            for c in eng.compile]
    if eng.adapter is not None:
        out.append((semconv.SPAN_ADAPTER_LOAD, semconv.STAGE_WARMUP_ADAPTER, *eng.adapter, {}))
    return out


def compile_evidence(c: CompileTime) -> dict[str, Any]:
    """What a compile inside a step compiled, and that step's shape."""
    attrs: dict[str, Any] = {
        semconv.ATTR_COMPILE_ID: c.compile_id, semconv.ATTR_COMPILE_RECOMPILE: c.recompile,
        semconv.ATTR_COMPILE_MODEL_GRAPH: c.model_graph,
        semconv.ATTR_STEP_TOKENS: c.step_tokens, semconv.ATTR_STEP_REQUESTS: c.step_requests,
        semconv.ATTR_COMPILE_COMPILER: c.compiler}
    if c.frame:
        attrs[semconv.ATTR_COMPILE_FRAME] = c.frame
    return attrs


def wait_spans(eng: EnginePayload | None, limit: float | None = None,
               scheduled: float | None = None) -> list[Warmup]:
    """``prefill.wait``: per step that ran its prefill while EngineCore or the worker waited
    for a CPU (:func:`attributes.named_waits`), the wait as a span (ending at ``limit`` at the
    latest: the first token), its evidence as attributes. Where in the step the waiting fell is
    not measured; the rest of the step stays ``prefill``."""
    out: list[Warmup] = []
    for wait in named_waits(eng, scheduled):
        end = wait.start + wait.seconds
        if limit is not None and end > limit:
            end = limit
        out.append((semconv.SPAN_PREFILL_WAIT, semconv.STAGE_PREFILL_WAIT,
                    end - wait.seconds, end, wait.evidence))
    return out
