"""Requests that end other than by their final output (aborted, an engine failure) and vLLM's
own ``llm_request`` when its tracing is on: the API process's other ways out of ``live``
(``api`` holds the record and its usual end)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request import state
from otel_ttft.runtime.hooks.request.api import ends_in_finish_hook
from otel_ttft.runtime.hooks.request.settle import end, record_from_stats
from otel_ttft.runtime.hooks.request.state import (
    forget,
    live,
    output_tokens,
    settling,
)


def wrap_abort_requests(call: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """Aborted requests (client gone, shutdown) are closed too."""
    request_ids = args[0] if args else kwargs.get("request_ids", ())
    if not isinstance(request_ids, (list, tuple, set, frozenset)):
        request_ids = list(request_ids)  # read it here and hand vLLM the same ids
        args, kwargs = ((request_ids, *args[1:]), kwargs) if args else (
            args, {**kwargs, "request_ids": request_ids})
    # Requests without a record (``api._counted_at_end``) are read before vLLM lets them go.
    unrecorded = _unrecorded(instance, request_ids) if state.counted_at_end else {}
    aborted = call(*args, **kwargs)
    now = time.monotonic()
    for rid in aborted or ():
        rec = forget(rid)
        if rec is None:
            req_state = unrecorded.get(rid)
            rec = None if req_state is None else record_from_stats(req_state, None, now)
            if rec is not None:
                rec.aborted = True
                request_spans.emit_request(rec, now)
            continue
        rec.aborted = rec.finish is None
        rec.done = rec.done or now
        rec.out_tokens = output_tokens(rec.state) or rec.out_tokens
        request_spans.emit_request(rec, now)
    if settling:
        for rid in request_ids:
            rec = settling.pop(rid, None)
            if rec is not None:
                # Finished in the engine, but the caller left before taking the final output
                # (still in its queue): the caller never got it, so the request was aborted.
                rec.aborted = not rec.taken and rec.queue.output is not None
                request_spans.emit_request(rec, now)
    return aborted


def _unrecorded(instance: Any, request_ids: Any) -> dict[str, Any]:
    """vLLM's request states of the requests these (internal or external) ids name that have
    no record of ours."""
    states = instance.request_states
    found = {}
    for rid in request_ids:
        for internal in (rid, *getattr(instance, "external_req_ids", {}).get(rid, ())):
            req_state = states.get(internal)
            if req_state is not None and internal not in live:
                found[internal] = req_state
    return found


def wrap_propagate_error(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    """An engine failure reaches every open request."""
    exc = args[0] if args else kwargs.get("e")
    result = call(*args, **kwargs)
    now = time.monotonic()
    error = f"{type(exc).__name__}: {exc}"
    for rid, rec in list(live.items()):
        rec.error = error
        rec.out_tokens = output_tokens(rec.state) or rec.out_tokens
        rec.done = rec.done or now
        forget(rid)
        request_spans.emit_request(rec, now)
    if state.counted_at_end:  # the open requests without a record
        for rid, req_state in list(instance.request_states.items()):
            rec = None if rid in live or rid in settling else record_from_stats(
                req_state, None, now)
            if rec is not None:
                rec.error = error
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
    if ends_in_finish_hook() and req_state.request_id not in instance.request_states:
        if rec.finish is None:
            rec.finish = _finish_reason(args, kwargs)
        end([rec], time.monotonic())
    return None


def _finish_reason(args: tuple, kwargs: dict) -> str | None:
    """``do_tracing``'s final output's finish reason (a stop string's: ``stop``)."""
    eco = args[0] if args else kwargs.get("engine_core_output")
    reason = getattr(eco, "finish_reason", None)
    return str(reason) if reason is not None else "stop"
