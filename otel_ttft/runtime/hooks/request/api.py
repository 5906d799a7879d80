"""The request path's hooks in the API process and its part (:class:`ApiRequests`): the
response's ``send``, the caller's trace headers, the record, its first outputs, and each way a
request ends (its final output, an abort, an engine failure, vLLM's own ``llm_request``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import activation, activation_verdict, first_use
from otel_ttft.runtime.hooks.registry import Stream
from otel_ttft.runtime.hooks.request.detail import DetailPolicy
from otel_ttft.runtime.hooks.request.metrics import RequestMetrics
from otel_ttft.runtime.hooks.request.settle import Settler
from otel_ttft.runtime.hooks.request.spans import RequestEmitter
from otel_ttft.runtime.hooks.request.state import (
    CALLER_HEADERS,
    FLUSH,
    TEXTS,
    FirstChunk,
    RequestRecord,
    Requests,
)


@cache
def _output_kinds() -> tuple[Any, Any]:
    """vLLM's ``RequestOutputKind`` members DELTA and FINAL_ONLY, looked up once."""
    from vllm.sampling_params import RequestOutputKind as K

    return K.DELTA, K.FINAL_ONLY


class ColdCounter:
    """The first ``cold_requests`` requests after an activation (start, wake-up, switch) of this
    process count as cold: the activation being counted (each is a new object) and the requests
    since."""

    __slots__ = ("limit", "activations", "counted", "count_since")

    def __init__(self, cold_requests: int, activations: Any) -> None:
        self.limit = cold_requests
        self.activations = activations  # the activation part: its ``latest``
        self.counted: Any = None
        self.count_since = 0

    def count(self) -> tuple[Any, int, bool]:
        """A request arrived: the latest activation (``None`` before the first), the request's
        position since it (1 = first; 0 without one) and whether that makes it cold."""
        act = self.activations.latest  # read, not called: once per request, in the busy step
        if act is None:
            return None, 0, False
        if act is not self.counted:
            self.counted, self.count_since = act, 0
        self.count_since += 1
        return act, self.count_since, self.count_since <= self.limit


class ApiRequests:
    """The API server's part (``request.api``): the records (``book``), which requests count as
    cold, the emitter (tracer, instruments, detail policy) and the settler that emits ended
    requests."""

    def __init__(self, process_state: Any, on_failure: Any) -> None:
        ps = process_state
        self.config = config = ps.config
        self.identity = ps.identity  # the process's: its served model names a request's
        self.capture = bool(config.capture_content)
        self.book = Requests()
        # the activation, first-use and verdict parts, made before (``hooks.all_parts``)
        self.cold = ColdCounter(config.cold_requests, ps.part(activation.PART))
        self.emitter = RequestEmitter(ps.tracer, RequestMetrics(config, ps.meter),
                                      DetailPolicy(config), ps.part(first_use.PART),
                                      ps.part(activation_verdict.PART))
        self.settler = Settler(self.book, self.emitter.emit, on_failure)

    def close(self) -> None:
        self.settler.close()
        self.emitter.close()
        self.book.clear()

    def telemetry_on(self) -> bool:
        """Whether a tracer or meter provider exists yet: without one, a record would be
        waste."""
        c = self.config
        return (c.tracer_provider is not None or c.meter_provider is not None
                or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
                or hasattr(metrics.get_meter_provider(), "force_flush"))


# --- starlette's StreamingResponse.stream_response: when the first token's chunk left -------------

def _timed(send: Callable[[Any], Awaitable[None]], box: FirstChunk) -> Callable[[Any], Any]:
    async def timed_send(message: Any) -> None:
        await send(message)
        if box.armed and box.first is None and message.get("type") == "http.response.body":
            box.first = time.monotonic()

    return timed_send


def wrap_stream_response(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """starlette's own ``stream_response``, with a ``send`` that timestamps the first body chunk
    after the request's first output; the box goes into the context of the task that runs the
    response, where ``generate`` finds it."""
    box = FirstChunk()
    FLUSH.set(box)
    if args:
        return call(_timed(args[0], box), *args[1:], **kwargs)
    return call(*args, **{**kwargs, "send": _timed(kwargs["send"], box)})


# --- AsyncLLM.add_request: the caller's trace headers ---------------------------------------------

def wrap_engine_add_request(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Notes the caller's ``trace_headers`` before vLLM drops them (it keeps them only for its
    own tracing). ``generate`` awaits this call in the task that then runs
    ``OutputProcessor.add_request``, where the record reads them."""
    CALLER_HEADERS.set(kwargs.get("trace_headers", args[6] if len(args) > 6 else None) or None)
    return call(*args, **kwargs)


# --- AsyncLLM.generate: content capture only ------------------------------------------------------

class CaptureText(Stream):
    """Opt-in content capture: the text ``generate`` hands to the HTTP layer, per choice. Applied
    only with capture on (``Hook.needs``)."""

    __slots__ = ("texts", "delta")

    def __init__(self, delta: bool):
        self.texts: dict[int, str] = {}
        self.delta = delta

    @classmethod
    def open(cls, part: ApiRequests, instance: Any, args: tuple,  # type: ignore[override]
             kwargs: dict) -> CaptureText | None:
        if not part.capture or not part.telemetry_on():
            return None
        params = args[1] if len(args) > 1 else kwargs.get("sampling_params")
        delta, _ = _output_kinds()
        return cls(getattr(params, "output_kind", None) is delta)

    def enter(self) -> Any:
        """vLLM's first step runs ``add_request``, which finds the texts through ``TEXTS``."""
        return TEXTS.set(self.texts)

    def leave(self, token: Any) -> None:
        TEXTS.reset(token)

    def item(self, item: Any) -> None:
        texts = self.texts
        for o in item.outputs:
            texts[o.index] = (texts.get(o.index, "") + o.text) if self.delta else o.text


# --- OutputProcessor.add_request: the record ------------------------------------------------------

def wrap_add_request(part: ApiRequests, call: Any, instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """Once per request, after vLLM's call; the record starts at vLLM's own arrival time.
    ``AsyncLLM.generate`` calls this in its own task (the HTTP response's): the current context
    holds the server span, if any, and ``FLUSH`` the response that streams the request."""
    result = call(*args, **kwargs)
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    book = part.book
    if rid in book.live:  # a streaming-input continuation: vLLM may end the request here
        if rid not in instance.request_states:
            part.settler.end(book.forget(rid), time.monotonic())
        return result
    if not part.telemetry_on():
        return result
    act, index, cold_now = part.cold.count()
    rec = RequestRecord(rid, request.external_req_id or rid,
                        request.arrival_time + time.monotonic() - time.time(),
                        otel_context.get_current())
    rec.activation, rec.cold_index, rec.cold = act, index, cold_now
    rec.params = request.sampling_params
    rec.lora = request.lora_request
    rec.trace_headers = request.trace_headers or CALLER_HEADERS.get()
    req_state = rec.state = instance.request_states.get(rid)
    if req_state is not None:
        rec.prompt_len = req_state.prompt_len
        if req_state.queue is not None and req_state.parent_req is None:  # one generate call
            rec.queue = req_state.queue
            _, final_only = _output_kinds()
            if getattr(rec.params, "output_kind", final_only) is not final_only:
                rec.streaming = True
                rec.flush = FLUSH.get()
    if part.capture:
        prompt = args[1] if len(args) > 1 else kwargs.get("prompt")
        rec.prompt = prompt if isinstance(prompt, str) else None
        rec.texts = TEXTS.get()
    rec.model = rec.lora.lora_name if rec.lora is not None else part.identity.served_model
    book.add(rec)
    return result


# --- OutputProcessor.process_outputs: the first two outputs of each request ----------------------

def wrap_process_outputs(part: ApiRequests, call: Any, instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """Ahead of vLLM's step, the outputs of the requests still waiting for their first two
    tokens (``fresh``): when the first came, EngineCore's payload, the events, the second
    token's time. A step with no such request costs a dict's truth test. A request the engine
    rejected on arrival (vLLM 0.33's ``EngineCoreOutput.error``) ends in this step."""
    book = part.book
    fresh = book.fresh
    if not fresh:
        return call(*args, **kwargs)
    outputs = args[0] if args else kwargs["engine_core_outputs"]
    ts = args[1] if len(args) > 1 else kwargs.get("engine_core_timestamp")
    now = time.monotonic()
    rejected = []
    for eco in outputs:
        rec = fresh.get(eco.request_id)
        if rec is None:
            continue
        if rec.recv is None:
            rec.on_first(eco, ts or now, now)
            if rec.flush is not None:  # the response's next body chunk carries it
                rec.flush.armed = True
            if rec.rejected is not None:
                rejected.append(rec)
        else:
            rec.on_output(eco, ts or now)
        if rec.second_tok is not None or rec.rejected is not None or rec.finish is not None:
            book.watched(rec.rid)
    result = call(*args, **kwargs)
    for rec in rejected:  # vLLM let it go without ``_update_stats_from_finished``
        if rec.rid not in instance.request_states:
            part.settler.end(book.forget(rec.rid), now)
    return result


# --- OutputProcessor._update_stats_from_finished: a request ended ---------------------------------

def wrap_finished(part: ApiRequests, call: Any, instance: Any, args: tuple,
                  kwargs: dict) -> Any:
    """vLLM calls ``_update_stats_from_finished`` once per request its outputs ended (a final
    output, or a stop string its detokenizer found), after freeing it. With vLLM's tracing on,
    ``do_tracing`` follows and ends it instead (``wrap_do_tracing``), carrying vLLM's
    attributes."""
    result = call(*args, **kwargs)
    if not instance.tracing_enabled:
        req_state = args[0] if args else kwargs["req_state"]
        rec = part.book.forget(req_state.request_id)
        if rec is not None:
            if rec.finish is None:
                rec.finish = args[1] if len(args) > 1 else kwargs.get("finish_reason")
            part.settler.end(rec, time.monotonic())
    return result


# --- the other ways out: an abort, an engine failure, vLLM's own llm_request ---------------------

def wrap_abort_requests(part: ApiRequests, call: Any, instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """Aborted requests (client gone, shutdown) are closed too."""
    request_ids = args[0] if args else kwargs.get("request_ids", ())
    if not isinstance(request_ids, (list, tuple, set, frozenset)):
        request_ids = list(request_ids)  # read it here and hand vLLM the same ids
        args, kwargs = ((request_ids, *args[1:]), kwargs) if args else (
            args, {**kwargs, "request_ids": request_ids})
    aborted = call(*args, **kwargs)
    now = time.monotonic()
    for rid in aborted or ():
        rec = part.book.forget(rid)
        if rec is not None:
            rec.aborted = rec.finish is None
            rec.read_end(now)
            part.emitter.emit(rec, now)
    for rid in request_ids:
        rec = part.book.settling.pop(rid, None)
        if rec is not None:
            # Finished in the engine, but the caller left before taking the final output
            # (still in its queue): the caller never got it, so the request was aborted.
            rec.aborted = not rec.taken()
            part.emitter.emit(rec, now)
    return aborted


def wrap_propagate_error(part: ApiRequests, call: Any, instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """An engine failure reaches every open request."""
    exc = args[0] if args else kwargs.get("e")
    result = call(*args, **kwargs)
    now = time.monotonic()
    error = f"{type(exc).__name__}: {exc}"
    for rid in list(part.book.live):
        rec = part.book.forget(rid)
        if rec is not None:
            rec.error = error
            rec.read_end(now)
            part.emitter.emit(rec, now)
    return result


def wrap_do_tracing(part: ApiRequests, call: Any, instance: Any, args: tuple,
                    kwargs: dict) -> Any:
    """vLLM's ``llm_request`` becomes ours; its attributes are carried over."""
    req_state = args[1] if len(args) > 1 else kwargs["req_state"]
    rec = part.book.live.get(req_state.request_id)
    if rec is None:
        return call(*args, **kwargs)
    iteration_stats = args[2] if len(args) > 2 else kwargs.get("iteration_stats")
    from vllm.tracing.utils import SpanAttributes as V  # vLLM's own names, carried as they are

    m = req_state.stats
    rec.vllm = {
        semconv.VLLM_LATENCY_TTFT: m.first_token_latency,
        V.GEN_AI_LATENCY_E2E: iteration_stats.iteration_timestamp - m.arrival_time,
        V.GEN_AI_LATENCY_TIME_IN_QUEUE: m.scheduled_ts - m.queued_ts,
        V.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: m.first_token_ts - m.scheduled_ts,
        V.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: m.last_token_ts - m.first_token_ts,
        V.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: m.last_token_ts - m.scheduled_ts,
        V.GEN_AI_USAGE_PROMPT_TOKENS: rec.prompt_len,
        V.GEN_AI_USAGE_COMPLETION_TOKENS: m.num_generation_tokens,
        semconv.VLLM_REQUEST_ID: req_state.external_req_id,
    }
    if req_state.n:
        rec.vllm[V.GEN_AI_REQUEST_N] = req_state.n
    if req_state.request_id not in instance.request_states:
        if rec.finish is None:
            eco = args[0] if args else kwargs.get("engine_core_output")
            reason = getattr(eco, "finish_reason", None)
            rec.finish = str(reason) if reason is not None else "stop"  # a stop string's
        part.settler.end(part.book.forget(rec.rid), time.monotonic())
    return None
