"""The request path's hooks in the API process (see the package docstring for the lifecycle)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any

import msgspec

from otel_ttft.runtime import config, ids
from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.hooks.registry import (
    PASS,
    Hook,
    Split,
    Stream,
    applied,
    bypass,
    report_failure,
    restore,
    working,
)
from otel_ttft.runtime.hooks.request import attributes as request_attributes
from otel_ttft.runtime.hooks.request import cold, settle, state
from otel_ttft.runtime.hooks.request.attributes import PARAM_GETTER
from otel_ttft.runtime.hooks.request.flush import FLUSH
from otel_ttft.runtime.hooks.request.settle import end, end_from_stats
from otel_ttft.runtime.hooks.request.state import (
    CALLER_HEADERS,
    TEXTS,
    RequestRecord,
    fresh,
    live,
    stoppable,
)
from otel_ttft.runtime.telemetry import sdk_internals
from otel_ttft.semconv import DETAIL_AUTO, DETAIL_NONE
from otel_ttft.semconv import PROCESS_API_SERVER as API_SERVER


@cache
def _output_kinds() -> tuple[Any, Any]:
    """vLLM's ``RequestOutputKind`` members DELTA and FINAL_ONLY, looked up once."""
    from vllm.sampling_params import RequestOutputKind as K

    return K.DELTA, K.FINAL_ONLY


_current_context = sdk_internals.current_context_getter()
"""``opentelemetry.context.get_current``, without its two Python frames."""


# --- AsyncLLM.generate: content capture only ------------------------------------------------------

class CaptureText(Stream):
    """Opt-in content capture: the text ``generate`` hands to the HTTP layer, per choice. Applied
    only with capture on (``Hook.needs``; ``open`` checks again): a pass-through generator cost
    every request about 12 us and every streamed output a frame switch, and all else about a
    request is seen from the ``OutputProcessor``."""

    __slots__ = ("texts", "delta")

    def __init__(self, delta: bool):
        self.texts: dict[int, str] = {}
        self.delta = delta

    @classmethod
    def open(cls, instance: Any, args: tuple, kwargs: dict) -> CaptureText | None:
        if not config.current.capture_content or not state.telemetry_on():
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


# --- OutputProcessor.add_request -----------------------------------------------------------------

def after_add_request(token: Any, instance: Any, args: tuple, kwargs: dict,
                      result: Any) -> None:
    """Once per request, after vLLM's call. The record starts at vLLM's own arrival time.
    ``AsyncLLM.generate`` calls this in its own task (the HTTP response's): the current context
    holds the server span, if any, and ``FLUSH`` the response that streams the request."""
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    if rid in live:  # a streaming-input continuation: vLLM may end the request here
        if rid not in instance.request_states:
            end([live[rid]], time.monotonic())
        return
    if not (state.telemetry_seen or state.telemetry_on()):
        return  # no provider to report to
    act, index, cold_now = cold.count()
    context = _current_context()
    sampled = False
    if (not cold_now and not context and not request.trace_headers
            and request.sampling_params is not None):  # generation, not pooling
        counted = _counted_at_end(instance)
        if counted:
            return  # a warm request nobody traces: counted at its end (``settle.end_from_stats``)
        sampled = counted is None
    rec = RequestRecord(rid, request.external_req_id or rid,
                        request.arrival_time + time.monotonic() - time.time(), context)
    rec.activation, rec.cold_index, rec.cold, rec.sampled = act, index, cold_now, sampled
    params = request.sampling_params
    try:  # the values its span may carry, read while vLLM's ``SamplingParams`` is warm
        rec.params = PARAM_GETTER(params)
    except AttributeError:  # none (pooling), or not vLLM's
        rec.params = request_attributes.param_values(params)
    rec.lora = request.lora_request
    rec.trace_headers = request.trace_headers or (
        CALLER_HEADERS.get() if state.caller_headers_seen else None)
    req_state = rec.state = instance.request_states.get(rid)
    if req_state is not None:
        rec.prompt_len = req_state.prompt_len
        if req_state.queue is not None and req_state.parent_req is None:  # one generate call
            rec.queue = req_state.queue
            _, final_only = _output_kinds()
            if getattr(params, "output_kind", final_only) is not final_only:
                rec.streaming = True
                rec.flush = FLUSH.get()
    if config.current.capture_content:
        prompt = args[1] if len(args) > 1 else kwargs.get("prompt")
        rec.prompt = prompt if isinstance(prompt, str) else None
        rec.texts = TEXTS.get()
    rec.model = rec.lora.lora_name if rec.lora is not None else this_process.served_model
    live[rid] = rec
    if not _watch(rec, instance, req_state):
        fresh[rid] = rec
        restore(instance, "process_outputs")  # its first outputs are looked at every step
    if getattr(params, "stop", None) and not ends_in_finish_hook():
        stoppable.add(rid)  # its detokenizer may end it (``after_process_outputs``)


wrap_add_request = Split(after=after_add_request)

RECORD_EVERY_S = 1.0
"""Warm untraced requests still get a record at least this often (the first after a quiet
second): the engine's state at arrival (``ttft.request.arrival.*``), the first chunk's write
and the second token keep being measured on a busy server, and on a quiet one every request
gets its record."""
_last_record = [-RECORD_EVERY_S]  # when the latest warm untraced request got its record


def _counted_at_end(instance: Any) -> bool | None:
    """For a warm request without a caller's trace: ``True`` where it is counted at its end from
    vLLM's own stats alone, without a record (the default policy's usual request); ``False``
    where it gets a record; ``None`` where it gets one because it was drawn for the sampled
    share (``OTEL_TTFT_REQUEST_DETAIL_RATIO``). A record costs the busy API server about 60 us
    of CPU a request (measured end to end: 2-3 % of vLLM's own), most of it looking at the
    request's first outputs while vLLM's caches hold other work; vLLM's ``RequestStateStats``
    already hold what its TTFT sample and stage times need."""
    settings = config.current
    if (settings.request_detail not in (DETAIL_AUTO, DETAIL_NONE) or settings.capture_content
            or (state.caller_headers_seen and CALLER_HEADERS.get() is not None)
            or not getattr(instance, "log_stats", False) or instance.tracing_enabled
            or not ends_in_finish_hook()):
        return False
    now = time.monotonic()
    if now - _last_record[0] >= RECORD_EVERY_S:
        _last_record[0] = now
        return False
    if settings.detail_ratio and ids.chance(settings.detail_ratio):
        return None
    state.counted_at_end = True
    return True


# --- the first two outputs of one request, on its own LogprobsProcessor --------------------------

class FirstOutputs(msgspec.Struct, eq=False):
    """vLLM's ``LogprobsProcessor.update_from_output`` of one request until its second token:
    set on that request's own processor (an instance attribute shadows the class's method), so
    vLLM's ``process_outputs`` runs a frame of ours for that request's outputs only, and no frame
    a step. The per-step look (``before_process_outputs``) stood aside only while no request
    waited for its first tokens: under load some request always does (queued behind vLLM's
    running sequences), and measured end to end at concurrency 16 that look cost the API server
    1.6 % of its CPU (paired, emission stubbed out). vLLM calls this after its stats took the
    step's engine timestamp (``last_token_ts``) and before the output reaches the caller's queue
    (the response's next chunk carries it: ``flush``). A ``msgspec.Struct``: made in C, without
    an ``__init__`` frame; each frame of ours costs the busy server a few microseconds."""

    rec: RequestRecord
    stats: Any
    call: Callable[[Any], Any]

    def __call__(self, eco: Any) -> Any:
        rec = self.rec
        try:
            hook = applied.get(OUTPUTS_HOOK_NAME)  # ``registry.working``, without its frame
            if hook is None or hook.failed:  # uninstrumented, or failed elsewhere
                rec.unwatch()
            elif rec.recv is None:
                now = time.monotonic()
                rec.on_first(eco, self.stats.last_token_ts or now, now)
            else:  # ``RequestRecord.on_output`` and ``unwatch`` in line: two frames less
                n = len(eco.new_token_ids)
                rec.out_tokens += n
                if eco.events is not None:
                    rec.on_events(eco.events)
                if eco.finish_reason is not None:
                    rec.finish = eco.finish_reason
                if n:  # its second token: vLLM's own method from now on
                    rec.second_tok = self.stats.last_token_ts or time.monotonic()
                    processor, rec.watch = rec.watch, None
                    if processor is not None:
                        try:  # noqa: SIM105 - once per request: no context manager
                            del processor.update_from_output
                        except AttributeError:
                            pass
        except Exception as exc:  # noqa: BLE001 - ours, outside any wrapper: the failure rule
            rec.unwatch()
            report_failure(OUTPUTS_HOOK, exc)
        return self.call(eco)


def _watch(rec: RequestRecord, instance: Any, req_state: Any) -> bool:
    """Whether the request's first outputs are seen on its own ``LogprobsProcessor``: where
    vLLM keeps stats (the step's engine timestamp), the request has a logprobs processor (not a
    pooling one) and requests end in ``wrap_finished``. Otherwise the per-step look does it."""
    if req_state is None or not getattr(instance, "log_stats", False):
        return False
    for name in (OUTPUTS_HOOK_NAME, FINISH_HOOK_NAME):  # both working (``registry.working``)
        hook = applied.get(name)
        if hook is None or hook.failed:
            return False
    processor = getattr(req_state, "logprobs_processor", None)
    stats = getattr(req_state, "stats", None)
    if processor is None or stats is None or not hasattr(stats, "last_token_ts"):
        return False
    # vLLM's own method, not something already shadowing it. Neither test reads the instance's
    # ``__dict__``: reading it makes a dict of the attributes the interpreter keeps inline, one
    # more object the garbage collector tracks for the request's whole life.
    call = processor.update_from_output
    if getattr(call, "__func__", None) is not getattr(type(processor), "update_from_output", 0):
        return False
    try:
        processor.update_from_output = FirstOutputs(rec, stats, call)
    except AttributeError:  # no instance attributes (``__slots__``)
        return False
    rec.watch = processor
    return True


# --- OutputProcessor.process_outputs (hot: every output of every request) ------------------------

def before_process_outputs(instance: Any, args: tuple, kwargs: dict) -> Any:
    """Ahead of vLLM's step: what the outputs of requests still waiting for their first two tokens
    (``fresh``) say, and scheduling events. Once none waits, the output processor calls vLLM's
    own method (``bypass``) until the next request arrives (``wrap_add_request``): at
    concurrency 1 most steps then run without a frame of ours. Requests end in
    ``wrap_finished``; only where that hook is missing are ends found here, every step
    (returned for ``after_process_outputs``)."""
    outputs = args[0] if args else kwargs["engine_core_outputs"]
    ts = args[1] if len(args) > 1 else kwargs.get("engine_core_timestamp")
    now = None
    ending = None
    for eco in outputs:
        if eco.events is None and eco.finish_reason is None and eco.request_id not in fresh:
            continue
        rec = live.get(eco.request_id)
        if rec is None or rec.watch is not None:  # unknown, or seen on its own (``FirstOutputs``)
            continue
        if rec.recv is None:
            if now is None:
                now = time.monotonic()
            rec.on_first(eco, ts or now, now)
        else:
            rec.on_output(eco, ts or time.monotonic())
        if eco.finish_reason is not None:
            if ending is None:
                ending = []
            ending.append(rec)
    if ends_in_finish_hook():
        if not fresh:
            bypass(instance, "process_outputs")
        return PASS
    return PASS if ending is None and not stoppable else ending


def after_process_outputs(ending: list[RequestRecord] | None, instance: Any, args: tuple,
                          kwargs: dict, result: Any) -> None:
    """Without ``wrap_finished`` (a vLLM that renamed it): the requests this step ended, by
    their final output or a stop string."""
    stopped = result.reqs_to_abort  # ended by a stop string the detokenizer found
    if ending or stopped:
        states = instance.request_states
        for rid in stopped:
            rec = live.get(rid)
            if rec is not None:
                if rec.finish is None:
                    rec.finish = "stop"
                ending = [*(ending or ()), rec]
        # vLLM freed them (a streaming-input request may take its next chunk instead); its own
        # tracing, if on, ran already: its attributes are ours to carry.
        end([rec for rec in ending if rec.rid not in states], time.monotonic())


wrap_process_outputs = Split(before_process_outputs, after_process_outputs)


# --- OutputProcessor._update_stats_from_finished: a request ended ---------------------------------

def ends_in_finish_hook() -> bool:
    """Whether requests end in ``wrap_finished`` (applied, and not bypassed by a failure)."""
    return working(FINISH_HOOK_NAME)


def after_finished(token: Any, instance: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """vLLM calls ``_update_stats_from_finished`` once per request its outputs ended (a final
    output, or a stop string its detokenizer found), after freeing it: the request ends here,
    whether or not our per-step hook still looks at its outputs. With vLLM's tracing on,
    ``do_tracing`` follows and ends it (``wrap_do_tracing``), carrying vLLM's attributes."""
    if not instance.tracing_enabled:
        req_state = args[0] if args else kwargs["req_state"]
        rec = live.get(req_state.request_id) if live else None
        if rec is not None:
            if rec.finish is None:  # vLLM's ``FinishReason``: its ``str`` when the span is built
                rec.finish = args[1] if len(args) > 1 else kwargs.get("finish_reason")
            end([rec], time.monotonic())
        elif state.counted_at_end:  # without a record (``_counted_at_end``)
            end_from_stats(req_state, args[1] if len(args) > 1 else kwargs.get("finish_reason"),
                           time.monotonic())


wrap_finished = Split(after=after_finished)


# Defined beside their wrappers: the batched emission (``settle``) runs outside any wrapper and
# reports its failures here, and the per-step hook relies on the finish hook while applied.
OUTPUTS_HOOK_NAME = "request.outputs"
OUTPUTS_HOOK = Hook(OUTPUTS_HOOK_NAME,
                    "vllm.v1.engine.output_processor:OutputProcessor.process_outputs",
                    wrap_process_outputs, process=API_SERVER)
FINISH_HOOK_NAME = "request.finish"
FINISH_HOOK = Hook(FINISH_HOOK_NAME,
                   "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished",
                   wrap_finished, process=API_SERVER)
settle.failures = OUTPUTS_HOOK
