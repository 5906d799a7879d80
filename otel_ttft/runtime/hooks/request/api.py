"""The request path's hooks in the API process: the caller's trace headers, the record, its first
outputs, its end (see the package docstring for the lifecycle), and the API server's part
(:class:`ApiRequests`) they are handed."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from otel_ttft.runtime.hooks.registry import Stream
from otel_ttft.runtime.hooks.request.cold import ColdCounter
from otel_ttft.runtime.hooks.request.detail import DetailPolicy
from otel_ttft.runtime.hooks.request.flush import FLUSH
from otel_ttft.runtime.hooks.request.metrics import RequestMetrics
from otel_ttft.runtime.hooks.request.settle import Settler
from otel_ttft.runtime.hooks.request.spans import RequestEmitter
from otel_ttft.runtime.hooks.request.state import CALLER_HEADERS, TEXTS, RequestRecord, Requests


@cache
def _output_kinds() -> tuple[Any, Any]:
    """vLLM's ``RequestOutputKind`` members DELTA and FINAL_ONLY, looked up once."""
    from vllm.sampling_params import RequestOutputKind as K

    return K.DELTA, K.FINAL_ONLY


class ApiRequests:
    """The API server's part (``request.api``): the records (``book``), which requests count as
    cold, the emitter (tracer, instruments, detail policy) and the settler that emits ended
    requests. The hooks here and in ``ends`` call their methods."""

    def __init__(self, config: Any, tracer: trace.Tracer, meter: metrics.Meter,
                 on_failure: Any, *, identity: Any, activations: Any, fills: Any,
                 verdict: Any) -> None:
        self.config = config
        self.identity = identity  # the process's: its served model names a request's
        self.capture = bool(config.capture_content)
        self.book = Requests()
        self.cold = ColdCounter(config.cold_requests, activations)
        self.emitter = RequestEmitter(tracer, RequestMetrics(meter), DetailPolicy(config),
                                      fills, verdict)
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
    ``do_tracing`` follows and ends it instead (``ends.wrap_do_tracing``), carrying vLLM's
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
