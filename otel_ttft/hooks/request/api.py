"""The request path's hooks in the API process (see the package docstring for the lifecycle)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any

from opentelemetry import context as otel_context

from otel_ttft import config, semconv, spans
from otel_ttft.hooks.registry import ABORTED, FAILED, Stream
from otel_ttft.hooks.request import cold, state
from otel_ttft.hooks.request import spans as request_spans
from otel_ttft.hooks.request.state import (
    FLUSH,
    HANDLE,
    FlushBox,
    Handle,
    RequestRecord,
    done,
    forget,
    fresh,
    live,
    output_tokens,
)


@cache
def _output_kinds() -> tuple[int, int]:
    """vLLM's ``RequestOutputKind`` values for DELTA and FINAL_ONLY, looked up once."""
    from vllm.sampling_params import RequestOutputKind as K

    return K.DELTA.value, K.FINAL_ONLY.value


# --- AsyncLLM.generate --------------------------------------------------------------------------

class Generate(Stream):
    """One ``generate`` call, seen through the registry's pass-through: the caller's context,
    when the first output was handed over, and how the stream ended (so that no request is left
    unreported, however it ends)."""

    __slots__ = ("handle", "each_item")

    def __init__(self, handle: Handle):
        self.handle = handle
        self.each_item = handle.texts is not None  # only captured text needs every output

    @classmethod
    def open(cls, instance: Any, args: tuple, kwargs: dict) -> Generate | None:
        if not state.telemetry_on():
            return None
        return cls(_new_handle(instance, args, kwargs))

    def enter(self) -> Any:
        """vLLM's first step runs ``add_request``, which finds this call through ``HANDLE``."""
        self.handle.flush = FLUSH.get()
        return HANDLE.set(self.handle)

    def leave(self, token: Any) -> None:
        HANDLE.reset(token)

    def first(self, item: Any) -> None:
        handle = self.handle
        handle.first_out = time.monotonic()
        if handle.flush is not None:
            handle.flush.armed = True
        self.item(item)

    def item(self, item: Any) -> None:
        """Captured text only (opt-in); the finish reasons are read off the last item."""
        if self.handle.texts is not None:
            _note_text(self.handle, item)

    def close(self, outcome: str, error: BaseException | None, last: Any) -> None:
        handle = self.handle
        if last is not None and last.finished:  # the final output was handed over
            handle.finish = [str(o.finish_reason) for o in last.outputs if o.finish_reason]
        if outcome == ABORTED:
            handle.aborted = True
        elif outcome == FAILED:
            handle.error = f"{type(error).__name__}: {error}"
        _close_handle(handle)


def _new_handle(instance: Any, args: tuple, kwargs: dict) -> Handle:
    params = args[1] if len(args) > 1 else kwargs.get("sampling_params")
    delta, final_only = _output_kinds()
    output_kind = getattr(getattr(params, "output_kind", None), "value", 0)
    streaming = output_kind != final_only and (getattr(params, "n", 1) or 1) == 1
    model_config = getattr(instance, "model_config", None)
    model = getattr(model_config, "served_model_name", None) or spans.served_model
    if isinstance(model, (list, tuple)):
        model = model[0] if model else None
    # The parent is resolved when the spans are built, off the request's path.
    return Handle(kwargs.get("trace_headers"), otel_context.get_current(),
                  str(model) if model else None, streaming, delta=output_kind == delta,
                  texts={} if config.current.capture_content else None)


def _note_text(handle: Handle, out: Any) -> None:
    """Opt-in only: the text handed to the HTTP layer, per choice."""
    texts = handle.texts
    for o in out.outputs:
        texts[o.index] = (texts.get(o.index, "") + o.text) if handle.delta else o.text


def _close_handle(handle: Handle) -> None:
    now = time.monotonic()
    for rec in handle.records:
        forget(rec.rid)
        if handle.error and rec.error is None and rec.rejected is None:
            rec.error = handle.error
        if handle.aborted and not handle.finish:
            # The caller left before the final output reached it: aborted, even if the engine
            # had finished the request meanwhile (its final output was still queued for us).
            rec.aborted = True
        request_spans.emit_request(rec, now)
    handle.records.clear()


# --- OutputProcessor.add_request -----------------------------------------------------------------

def wrap_add_request(call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """Once per request. The record starts at vLLM's own arrival time."""
    result = call(*args, **kwargs)
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    if rid in live or not state.telemetry_on():
        return result  # a streaming-input continuation, or no provider to report to
    mono_minus_wall = time.monotonic() - time.time()
    handle = HANDLE.get()
    rec = RequestRecord(rid, request.external_req_id or rid, handle,
                        request.arrival_time + mono_minus_wall)
    rec.params = request.sampling_params
    rec.lora = request.lora_request
    rec.trace_headers = request.trace_headers
    req_state = instance.request_states.get(rid)
    rec.prompt_len = getattr(req_state, "prompt_len", None)
    if config.current.capture_content:
        prompt = args[1] if len(args) > 1 else kwargs.get("prompt")
        rec.prompt = prompt if isinstance(prompt, str) else None
    rec.model = (rec.lora.lora_name if rec.lora is not None
                 else (handle.model if handle is not None else spans.served_model))
    cold.note_activation(rec)
    live[rid] = fresh[rid] = rec
    if handle is not None:
        handle.records.append(rec)
    return result


# --- OutputProcessor.process_outputs (hot: every output of every request) ------------------------

def wrap_process_outputs(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    if live:
        _observe(args, kwargs)
    result = call(*args, **kwargs)
    if done:
        _flush_done()
    return result


def _observe(args: tuple, kwargs: dict) -> None:
    """Per output, two attribute reads and one lookup in ``fresh``; the record only for a
    request's first two outputs, scheduling events and its final output (tokens are counted
    once, when it ends)."""
    outputs = args[0] if args else kwargs["engine_core_outputs"]
    ts = args[1] if len(args) > 1 else kwargs.get("engine_core_timestamp")
    now = None
    for eco in outputs:
        if eco.events is None and eco.finish_reason is None and eco.request_id not in fresh:
            continue
        rec = live.get(eco.request_id)
        if rec is None:
            continue
        if rec.recv is None:
            if now is None:
                now = time.monotonic()
            rec.on_first(eco, ts or now, now)
        else:
            rec.on_output(eco, ts or time.monotonic())


def _flush_done() -> None:
    finished = list(done)
    done.clear()
    now = time.monotonic()
    for rec in finished:
        forget(rec.rid)
        if rec.handle is None:
            request_spans.emit_request(rec, rec.done or now)


def wrap_finish_request(call: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """The request left the OutputProcessor normally."""
    result = call(*args, **kwargs)
    req_state = args[0] if args else kwargs["req_state"]
    rec = live.get(req_state.request_id)
    if rec is not None and rec.done is None:
        rec.done = time.monotonic()
        rec.out_tokens = output_tokens(req_state) or rec.out_tokens
        done.append(rec)
    return result


def wrap_abort_requests(call: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """Aborted requests (client gone, stop string, shutdown) are closed too."""
    request_ids = args[0] if args else kwargs.get("request_ids", ())
    if not isinstance(request_ids, (list, tuple, set, frozenset)):
        request_ids = list(request_ids)  # read it here and hand vLLM the same ids
        args, kwargs = ((request_ids, *args[1:]), kwargs) if args else (
            args, {**kwargs, "request_ids": request_ids})
    counts = _token_counts(instance, request_ids)
    aborted = call(*args, **kwargs)
    now = time.monotonic()
    for rid in aborted or ():
        rec = forget(rid)
        if rec is None:
            continue
        rec.aborted = rec.finish is None
        rec.done = rec.done or now
        rec.out_tokens = counts.get(rid) or rec.out_tokens
        if rec.handle is None:
            request_spans.emit_request(rec, now)
    return aborted


def _token_counts(instance: Any, request_ids: Any) -> dict[str, int | None]:
    """Output tokens of the records about to be aborted (by internal or external id), read
    before vLLM drops their state."""
    states = instance.request_states
    external = getattr(instance, "external_req_ids", {})
    counts: dict[str, int | None] = {}
    for rid in request_ids:
        for internal in (rid, *external.get(rid, ())):
            req_state = states.get(internal)
            if req_state is not None and internal in live:
                counts[internal] = output_tokens(req_state)
    return counts


def wrap_propagate_error(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """An engine failure reaches every open request."""
    exc = args[0] if args else kwargs.get("e")
    states = instance.request_states
    for rid, rec in live.items():
        if rid in states:
            rec.out_tokens = output_tokens(states[rid]) or rec.out_tokens
    result = call(*args, **kwargs)
    now = time.monotonic()
    for rid, rec in list(live.items()):
        rec.error = f"{type(exc).__name__}: {exc}"
        rec.done = rec.done or now
        if rec.handle is None:
            forget(rid)
            request_spans.emit_request(rec, now)
    return result


def wrap_do_tracing(call: Callable[..., Any], instance: Any, args: tuple,
                    kwargs: dict) -> Any:
    """vLLM's ``llm_request`` becomes ours; its attributes are carried over."""
    req_state = args[1] if len(args) > 1 else kwargs["req_state"]
    rec = live.get(req_state.request_id)
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
    return None


# --- starlette StreamingResponse.stream_response: when the first token's chunk left ------------

class _TimedSend:
    """Stands in for the ASGI ``send`` of one streaming response. Every message but one goes
    straight through (no extra coroutine frame per chunk); the first body chunk after the
    request's first output is awaited here and timestamped once the server has written it."""

    __slots__ = ("send", "box")

    def __init__(self, send: Any, box: FlushBox):
        self.send, self.box = send, box

    def __call__(self, message: Any) -> Any:
        box = self.box
        if box.armed and box.first is None and message.get("type") == "http.response.body":
            return self._first(message)
        return self.send(message)

    async def _first(self, message: Any) -> None:
        await self.send(message)
        self.box.first = time.monotonic()


def wrap_stream_response(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """Hands starlette's own ``stream_response`` coroutine back, with our ``send`` inside it: a
    plain function on purpose. An ``async`` wrapper would sit, three coroutine frames deep,
    around every response for its whole life, and measured end to end that cost the API process
    about 1.6 ms of CPU per streamed request (open loop, 12 req/s), more than all our other hooks
    together. The box goes into the context of the task that runs the response (starlette
    gives it a task of its own), where ``generate`` finds it."""
    send = args[0] if args else kwargs.pop("send")
    box = FlushBox()
    FLUSH.set(box)
    return call(_TimedSend(send, box), *args[1:], **kwargs)
