"""Sleep mode's eviction side: EngineCore's and the workers' "Sleep" [switch.sleep] under the API
process's ``vllm.switch``, whatever the worker count, with the bytes each worker moved.

Parents. The API process offers its ``vllm.switch`` to EngineCore in a hand-off file named by its
own pid (``runtime.handoff``): EngineCore is its child. A worker is EngineCore's child once there
are several (the multiprocess executor), so the file is not its parent's: a worker's span sits
under whatever called it, EngineCore's "Sleep", which reaches it in the process (one worker) or
over ``collective_rpc`` (``hooks.rpc``). When EngineCore must first drain in-flight requests,
vLLM puts the executor to sleep later, from a callback with no span current: the executor's
``sleep`` is then run under EngineCore's "Sleep", kept open in this part until the sleep completes.

Level 0 pauses scheduling only (no executor call): its "Sleep" ends when the pause completes.
``release_kv_cache_memory`` (``POST /release_kv_cache_memory``) gives the KV cache back and keeps
the weights: "Release KV cache memory" in EngineCore and "Discard device memory" in each worker.

Bytes. vLLM's sleep allocator (``CuMemAllocator``) keeps every allocation's size, whether it is
mapped and its host copy; the difference before and after its ``sleep``, ``wake_up`` and
``discard`` is what moved: device to host, host to device, given back, mapped again. Read on the
worker's span that is current (CUDA only; the allocator is not built elsewhere).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, handoff
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_ENGINE_CORE as ENGINE_CORE
from otel_ttft.semconv import PROCESS_WORKER as WORKER

PART = "sleep"
HANDOFF_SLEEP, HANDOFF_RELEASE = "sleep", "release_kv_cache_memory"


class SleepState:
    """The ``sleep`` part: the tracer, and EngineCore's "Sleep" spans still waiting for vLLM to
    finish the sleep (the executor's deferred ``sleep`` runs under the latest)."""

    def __init__(self, process_state: Any) -> None:
        self.config = process_state.config
        self.tracer = process_state.tracer
        self.identity = process_state.identity
        self._lock = threading.Lock()
        self._open: list[trace.Span] = []

    def began(self, span: trace.Span) -> None:
        with self._lock:
            self._open.append(span)

    def ended(self, span: trace.Span) -> None:
        with self._lock:
            if span in self._open:
                self._open.remove(span)
        span.end(end_time=clock.now_ns())

    def waiting(self) -> trace.Span | None:
        with self._lock:
            return self._open[-1] if self._open else None

    def close(self) -> None:
        with self._lock:
            left, self._open = self._open, []
        for span in left:
            span.set_attribute(semconv.ATTR_SPAN_ENDED_BY, "uninstrument")
            span.end(end_time=clock.now_ns())


def _sleep_span(part: SleepState, call: Callable[..., Any], args, kwargs,
                parent: otel_context.Context | None) -> Any:
    """Sleep may finish later (EngineCore drains in-flight requests first): end the span then."""
    level = args[0] if args else kwargs.get("level", 1)
    span = part.tracer.start_span(semconv.SPAN_SLEEP, context=parent, start_time=clock.now_ns(),
                                  attributes={semconv.ATTR_STAGE: semconv.STAGE_SWITCH_SLEEP})
    spans.tag_span(span, semconv.STAGE_SWITCH_SLEEP, {semconv.ATTR_SLEEP_LEVEL: int(level)},
                   part.identity)
    part.began(span)
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        result = call(*args, **kwargs)
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        part.ended(span)
        raise
    finally:
        otel_context.detach(token)
    if hasattr(result, "add_done_callback"):
        result.add_done_callback(lambda _f: part.ended(span))
    else:
        part.ended(span)
    return result


def _wrap_engine_sleep(part: SleepState, call, instance, args, kwargs):
    """EngineCore: under the API process's ``vllm.switch`` when it offered one."""
    if not config.tracing_ready(part.config):
        return call(*args, **kwargs)
    return _sleep_span(part, call, args, kwargs, handoff.taken(HANDOFF_SLEEP))


def _wrap_worker_sleep(part: SleepState, call, instance, args, kwargs):
    """A worker: under what called it (EngineCore's "Sleep"); with nothing current, under the
    switch its parent offered (EngineCore's own worker, when the API process is its parent)."""
    if not config.tracing_ready(part.config):
        return call(*args, **kwargs)
    current = trace.get_current_span().get_span_context().is_valid
    return _sleep_span(part, call, args, kwargs,
                       None if current else handoff.taken(HANDOFF_SLEEP))


def _wrap_executor_sleep(part: SleepState, call, instance, args, kwargs):
    """The executor's sleep, called by vLLM after the pause completed, with no span current:
    under EngineCore's "Sleep" that waits for it (so ``collective_rpc`` carries it on)."""
    waiting = part.waiting()
    if waiting is None or trace.get_current_span().get_span_context().is_valid:
        return call(*args, **kwargs)
    token = otel_context.attach(trace.set_span_in_context(waiting))
    try:
        return call(*args, **kwargs)
    finally:
        otel_context.detach(token)


def _wrap_engine_release_kv(part: SleepState, call, instance, args, kwargs):
    if not config.tracing_ready(part.config):
        return call(*args, **kwargs)
    with spans.stage_span(semconv.SPAN_RELEASE_KV, semconv.STAGE_SWITCH_SLEEP,
                          context=handoff.taken(HANDOFF_RELEASE), tracer=part.tracer,
                          identity=part.identity):
        return call(*args, **kwargs)


def _wrap_worker_discard(part: SleepState, call, instance, args, kwargs):
    if not config.tracing_ready(part.config):
        return call(*args, **kwargs)
    with spans.stage_span(semconv.SPAN_DISCARD, semconv.STAGE_SWITCH_SLEEP, tracer=part.tracer,
                          identity=part.identity):
        return call(*args, **kwargs)


# --- the bytes each worker moved, from vLLM's sleep allocator -----------------------------------

def _allocations(allocator: Any) -> dict[int, tuple[int, bool, bool]]:
    """Per allocation: (bytes, mapped on the device, kept in host memory)."""
    return {ptr: (int(data.handle[1]), not data.is_asleep, data.cpu_backup_tensor is not None)
            for ptr, data in allocator.pointer_to_data.items()}


def moved_bytes(before: dict[int, tuple[int, bool, bool]],
                after: dict[int, tuple[int, bool, bool]]) -> dict[str, int]:
    """What changed between two readings: copied to the host, given back, copied back to the
    device, mapped again."""
    moved = dict.fromkeys(("offloaded", "released", "restored", "mapped"), 0)
    for ptr, (size, mapped, kept) in before.items():
        now = after.get(ptr)
        if now is None:
            continue
        _, mapped_now, kept_now = now
        if mapped and not mapped_now:
            moved["released"] += size
            moved["offloaded"] += size if kept_now and not kept else 0
        elif not mapped and mapped_now:
            moved["mapped"] += size
            moved["restored"] += size if kept and not kept_now else 0
    return moved


_ATTRS = {"offloaded": semconv.ATTR_SLEEP_OFFLOADED_BYTES,
          "released": semconv.ATTR_SLEEP_RELEASED_BYTES,
          "restored": semconv.ATTR_WAKE_RESTORED_BYTES, "mapped": semconv.ATTR_WAKE_MAPPED_BYTES}


def _wrap_allocator(keys: tuple[str, ...]):
    def wrapper(call, instance, args, kwargs):
        span = trace.get_current_span()
        if not span.is_recording():
            return call(*args, **kwargs)
        before = _allocations(instance)
        result = call(*args, **kwargs)
        moved = moved_bytes(before, _allocations(instance))
        span.set_attributes({_ATTRS[k]: moved[k] for k in keys})
        return result
    return wrapper


_CORE = "vllm.v1.engine.core:EngineCore"
_WORKER = "vllm.v1.worker.gpu_worker:Worker"
_CUMEM = "vllm.device_allocator.cumem:CuMemAllocator"
HOOKS = [
    Hook("switch.engine_sleep", f"{_CORE}.sleep", _wrap_engine_sleep,
         stage=semconv.STAGE_SWITCH_SLEEP, process=ENGINE_CORE, state=PART),
    Hook("switch.executor_sleep", "vllm.v1.executor.abstract:Executor.sleep",
         _wrap_executor_sleep, stage=semconv.STAGE_SWITCH_SLEEP, process=ENGINE_CORE,
         state=PART),
    Hook("switch.worker_sleep", f"{_WORKER}.sleep", _wrap_worker_sleep,
         stage=semconv.STAGE_SWITCH_SLEEP, process=WORKER, state=PART),
    Hook("switch.engine_release_kv", f"{_CORE}.release_kv_cache_memory",
         _wrap_engine_release_kv, stage=semconv.STAGE_SWITCH_SLEEP, process=ENGINE_CORE,
         optional=True, state=PART),
    Hook("switch.worker_discard", f"{_WORKER}.discard", _wrap_worker_discard,
         stage=semconv.STAGE_SWITCH_SLEEP, process=WORKER, optional=True, state=PART),
    Hook("switch.sleep_bytes", f"{_CUMEM}.sleep", _wrap_allocator(("offloaded", "released")),
         stage=semconv.STAGE_SWITCH_SLEEP, process=WORKER, optional=True),
    Hook("switch.discard_bytes", f"{_CUMEM}.discard", _wrap_allocator(("released",)),
         stage=semconv.STAGE_SWITCH_SLEEP, process=WORKER, optional=True),
    Hook("switch.wake_bytes", f"{_CUMEM}.wake_up", _wrap_allocator(("restored", "mapped")),
         stage=semconv.STAGE_LOAD_H2D, process=WORKER, optional=True),
]
