"""The request path's hooks in the API process (see the package docstring for the lifecycle)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from opentelemetry import context as otel_context

from otel_ttft import semconv, spans
from otel_ttft.hooks.request import spans as request_spans
from otel_ttft.hooks.request import state as request_state
from otel_ttft.hooks.request.state import (
    FLUSH,
    HANDLE,
    FlushBox,
    Handle,
    Req,
    done,
    fail,
    live,
    note_activation,
)

_DELTA, _FINAL_ONLY = 1, 2  # vllm.sampling_params.RequestOutputKind values

# --- AsyncLLM.generate --------------------------------------------------------------------------

def wrap_generate(wrapped: Callable[..., Any], instance: Any, args: tuple,
                  kwargs: dict) -> Any:
    inner = wrapped(*args, **kwargs)
    if request_state.failed("generate") or not request_state.telemetry_on():
        return inner
    try:
        handle = _new_handle(instance, args, kwargs)
    except Exception as exc:  # noqa: BLE001
        fail("generate", exc)
        return inner
    return _traced(inner, handle)


def _new_handle(instance: Any, args: tuple, kwargs: dict) -> Handle:
    params = args[1] if len(args) > 1 else kwargs.get("sampling_params")
    output_kind = getattr(getattr(params, "output_kind", None), "value", 0)
    streaming = output_kind != _FINAL_ONLY and (getattr(params, "n", 1) or 1) == 1
    model_config = getattr(instance, "model_config", None)
    model = getattr(model_config, "served_model_name", None) or spans.served_model
    if isinstance(model, (list, tuple)):
        model = model[0] if model else None
    # The parent is resolved when the spans are built, off the request's path.
    return Handle(kwargs.get("trace_headers"), otel_context.get_current(),
                  str(model) if model else None, streaming, delta=output_kind == _DELTA)


async def _traced(inner: Any, handle: Handle) -> AsyncIterator[Any]:
    """vLLM's generator, passed through; our bookkeeping never raises into it."""
    try:
        handle.flush = FLUSH.get()
        token = HANDLE.set(handle)
        try:
            out = await inner.__anext__()
        finally:
            HANDLE.reset(token)
        handle.first_out = time.monotonic()
        if handle.flush is not None:
            handle.flush.armed = True
        while True:
            if out.finished or handle.texts is not None:
                _note_output(handle, out)
            yield out
            out = await inner.__anext__()
    except StopAsyncIteration:
        return
    except (GeneratorExit, asyncio.CancelledError):
        handle.aborted = True
        raise
    except BaseException as exc:
        handle.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:
            await inner.aclose()
        finally:
            _close_handle(handle)


def _note_text(handle: Handle, out: Any) -> None:
    """Opt-in only: the text handed to the HTTP layer, per choice."""
    texts = handle.texts
    for o in out.outputs:
        texts[o.index] = (texts.get(o.index, "") + o.text) if handle.delta else o.text


def _note_output(handle: Handle, out: Any) -> None:
    """The final output's finish reasons; with capture opted in, the text so far."""
    try:
        if out.finished:
            handle.finish = [str(o.finish_reason) for o in out.outputs if o.finish_reason]
        if handle.texts is not None:
            _note_text(handle, out)
    except Exception as exc:  # noqa: BLE001
        fail("generate.output", exc)


def _close_handle(handle: Handle) -> None:
    try:
        now = time.monotonic()
        for rec in handle.records:
            live.pop(rec.rid, None)
            if handle.error and rec.error is None:
                rec.error = handle.error
            if handle.aborted and rec.finish is None and not handle.finish:
                rec.aborted = True
            request_spans.emit_request(rec, now)
        handle.records.clear()
    except Exception as exc:  # noqa: BLE001
        fail("generate.close", exc)


# --- OutputProcessor.add_request -----------------------------------------------------------------

def wrap_add_request(call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """Guarded: once per request. The record starts at vLLM's own arrival time."""
    result = call(*args, **kwargs)
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    if rid in live or not request_state.telemetry_on():
        return result  # a streaming-input continuation, or no provider to report to
    mono_minus_wall = time.monotonic() - time.time()
    handle = HANDLE.get()
    rec = Req(rid, request.external_req_id or rid, handle, request.arrival_time + mono_minus_wall)
    rec.params = request.sampling_params
    rec.lora = request.lora_request
    rec.trace_headers = request.trace_headers
    state = instance.request_states.get(rid)
    rec.prompt_len = getattr(state, "prompt_len", None)
    if request_state.CAPTURE_CONTENT:
        prompt = args[1] if len(args) > 1 else kwargs.get("prompt")
        rec.prompt = prompt if isinstance(prompt, str) else None
    rec.model = (rec.lora.lora_name if rec.lora is not None
                 else (handle.model if handle is not None else spans.served_model))
    note_activation(rec)
    live[rid] = rec
    if handle is not None:
        handle.records.append(rec)
    return result


# --- OutputProcessor.process_outputs (hot: every output of every request) ------------------------

def wrap_process_outputs(wrapped: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    if live:
        try:
            _observe(args, kwargs)
        except Exception as exc:  # noqa: BLE001
            fail("process_outputs", exc)
    result = wrapped(*args, **kwargs)
    if done:
        try:
            _flush_done()
        except Exception as exc:  # noqa: BLE001
            fail("process_outputs.flush", exc)
    return result


def _observe(args: tuple, kwargs: dict) -> None:
    outputs = args[0] if args else kwargs["engine_core_outputs"]
    ts = args[1] if len(args) > 1 else kwargs.get("engine_core_timestamp")
    now = None
    for eco in outputs:
        rec = live.get(eco.request_id)
        if rec is None:
            continue
        if rec.recv is None:
            if now is None:
                now = time.monotonic()
            rec.on_first(eco, ts or now, now)
            continue
        n = len(eco.new_token_ids)
        rec.out_tokens += n
        if n and rec.second_tok is None:
            rec.second_tok = ts
        if eco.events is not None:
            rec.on_events(eco.events)
        if eco.finish_reason is not None:
            rec.finish = str(eco.finish_reason)


def _flush_done() -> None:
    finished = list(done)
    done.clear()
    now = time.monotonic()
    for rec in finished:
        live.pop(rec.rid, None)
        if rec.handle is None:
            request_spans.emit_request(rec, rec.done or now)


def wrap_finish_request(call: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """Guarded: the request left the OutputProcessor normally."""
    result = call(*args, **kwargs)
    req_state = args[0] if args else kwargs["req_state"]
    rec = live.get(req_state.request_id)
    if rec is not None and rec.done is None:
        rec.done = time.monotonic()
        done.append(rec)
    return result


def wrap_abort_requests(call: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """Guarded: aborted requests (client gone, stop string, shutdown) are closed too."""
    aborted = call(*args, **kwargs)
    now = time.monotonic()
    for rid in aborted or ():
        rec = live.pop(rid, None)
        if rec is None:
            continue
        rec.aborted = rec.finish is None
        rec.done = rec.done or now
        if rec.handle is None:
            request_spans.emit_request(rec, now)
    return aborted


def wrap_propagate_error(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """Guarded: an engine failure reaches every open request."""
    exc = args[0] if args else kwargs.get("e")
    result = call(*args, **kwargs)
    now = time.monotonic()
    for rid, rec in list(live.items()):
        rec.error = f"{type(exc).__name__}: {exc}"
        rec.done = rec.done or now
        if rec.handle is None:
            live.pop(rid, None)
            request_spans.emit_request(rec, now)
    return result


def wrap_do_tracing(call: Callable[..., Any], instance: Any, args: tuple,
                    kwargs: dict) -> Any:
    """Guarded: vLLM's ``llm_request`` becomes ours; its attributes are carried over."""
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


async def wrap_stream_response(wrapped: Callable[..., Any], instance: Any, args: tuple,
                               kwargs: dict) -> Any:
    try:
        send = args[0] if args else kwargs.pop("send")
        box = FlushBox()
        token = FLUSH.set(box)
    except Exception as exc:  # noqa: BLE001
        fail("stream_response", exc)
        return await wrapped(*args, **kwargs)
    try:
        return await wrapped(_TimedSend(send, box), *args[1:], **kwargs)
    finally:
        FLUSH.reset(token)
