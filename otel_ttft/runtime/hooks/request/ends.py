"""Requests that end other than by their final output (aborted, an engine failure) and vLLM's
own ``llm_request`` when its tracing is on: the API process's other ways out of ``live``
(``api`` holds the record and its usual end)."""

from __future__ import annotations

import time
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request.api import ApiRequests


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
