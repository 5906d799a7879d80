"""EngineCore side of the request path: count, never build spans.

Per request the engine notes, at ``Scheduler.add_request``, the waiting/running depth and free KV
blocks; counts admission attempts (each prefix-cache lookup the scheduler makes for a request at
the head of its waiting queue: a fresh or preempted request that then fails to get KV blocks is
looked up again next step); and, only when vLLM's stats logging is off, the queued/scheduled/
preempted times vLLM would otherwise record as events. Admissions that found no blocks are then
attempts minus admissions, computed in the API process. Per step the hooks cost a dict lookup per
output while some request is between arrival and its first output, and a truth test otherwise.

These ride back to the API process as the ``payload`` of the request's first ``EngineCoreOutput``.

Warm-up paid inside a request (a LoRA adapter loaded lazily, a torch.compile of something
start-up did not compile) is timed in the worker (``worker``) and charged here to the
requests that were waiting for their first token when it started (adapter loads: only those with
that adapter). Warm-up before any request was queued is thereby never charged to one. Steps a CPU
worker timed (wall against its thread's CPU time) go to the requests whose prefill they ran, and
so does EngineCore's own wait for a CPU within a step (``runqueue``), read at ``schedule`` and
after ``update_from_output`` while some request waits for its first token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request import payload, worker
from otel_ttft.runtime.hooks.request.payload import PREEMPTED, SCHEDULED, EnginePayload
from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock

_MAX_TRACKED = 65536

# request_id -> what EngineCore noted, from arrival at the scheduler until its first output
_state: dict[str, EnginePayload] = {}
_own_admission_times = False  # some scheduler here runs with vLLM's stats logging off
_run_queue = RunQueueClock()  # EngineCore's thread: its wait for a CPU
_step_start: tuple[float, float] | None = None  # (monotonic, run-queue seconds) at schedule()
_ENGINE_WAIT_MIN_S = 0.001  # shorter waits are not shipped (the verdict's bar is higher)


def _evict() -> None:
    for key in list(_state)[: _MAX_TRACKED // 2]:
        _state.pop(key, None)


# --- Scheduler.add_request: arrival at the engine ------------------------------------------------

def wrap_scheduler_add_request(call: Callable[..., Any], instance: Any, args: tuple,
                               kwargs: dict) -> Any:
    global _own_admission_times
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    if not instance.log_stats:
        _own_admission_times = True
    if rid not in _state:
        running, waiting = instance.get_request_counts()
        pool = instance.kv_cache_manager.block_pool
        if len(_state) >= _MAX_TRACKED:
            _evict()
        lora = request.lora_request
        _state[rid] = EnginePayload(time.monotonic(), waiting, running,
                                    pool.get_num_free_blocks(), pool.num_gpu_blocks,
                                    lora_id=lora.lora_int_id if lora is not None else 0)
    return call(*args, **kwargs)


# --- Scheduler._get_local_prefix_cache_hit: one admission attempt -------------------------------

def wrap_prefix_lookup(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Called once per admission attempt of a request whose KV is not computed yet."""
    if _state:
        st = _state.get((args[0] if args else kwargs["request"]).request_id)
        if st is not None:
            st.attempts += 1
    return call(*args, **kwargs)


# --- Scheduler.schedule: admission times, only when vLLM records no events -----------------------

def wrap_schedule(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    global _step_start
    if _state and _step_start is None:  # a request waits for its first token: time the steps
        _step_start = _run_queue_mark()
    if instance.log_stats or not _own_admission_times or not _state:
        return call(*args, **kwargs)  # vLLM stamps the events itself
    scheduled_at = time.monotonic()  # what vLLM stamps its SCHEDULED events with
    out = call(*args, **kwargs)
    ids = [r.req_id for r in out.scheduled_new_reqs]
    ids.extend(out.scheduled_cached_reqs.resumed_req_ids)
    for rid in ids:
        st = _state.get(rid)
        if st is not None:
            st.schedule.append((SCHEDULED, scheduled_at))
    return out


# --- Scheduler._preempt_request: only needed when vLLM records no events -------------------------

def wrap_preempt_request(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    result = call(*args, **kwargs)
    if not instance.log_stats:
        request = args[0] if args else kwargs["request"]
        timestamp = args[1] if len(args) > 1 else kwargs.get("timestamp", time.monotonic())
        st = _state.get(request.request_id)
        if st is not None:
            st.schedule.append((PREEMPTED, timestamp))
    return result


# --- Scheduler.update_from_output: ship the payload with each request's first output --------------

def wrap_update_from_output(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Each request's first output carries what EngineCore noted (``payload``), and warm-up a
    worker timed is charged to the requests waiting for their first token."""
    global _step_start
    outputs = call(*args, **kwargs)
    if not _state and not worker.pending and not worker.steps:
        _step_start = None
        return outputs
    if _step_start is not None:
        scheduled = args[0] if args else kwargs["scheduler_output"]
        _step_start = _charge_engine_wait(_step_start, scheduled)
    runner_output = args[1] if len(args) > 1 else kwargs.get("model_runner_output")
    events = getattr(runner_output, worker.WARMUP_ATTR, None) or worker.take_local()
    if events:
        _charge_warmup(events)
    timed = getattr(runner_output, worker.STEPS_ATTR, None) or worker.take_local_steps()
    if timed:
        _charge_steps(timed)
    for engine_outputs in outputs.values():
        for out in engine_outputs.outputs:
            st = _state.pop(out.request_id, None)
            if st is None:
                continue
            headers = dict(out.trace_headers) if out.trace_headers else {}
            headers[semconv.ENGINE_PAYLOAD_HEADER] = payload.encode(st)
            out.trace_headers = headers
    if not _state:
        _step_start = None
    return outputs


def _charge_warmup(events: list[worker.Note]) -> None:
    """Each warm-up interval goes to the requests already queued when it started (an adapter's
    load: only to those for that adapter); a CUDA-graph decision to the requests its step
    started."""
    for event in events:
        if isinstance(event, payload.GraphDispatch):
            for rid in event.request_ids:
                st = _state.get(rid)
                if st is not None and st.graph is None:
                    st.graph = event.choice
            continue
        for st in _state.values():
            if st.queued > event.start:
                continue
            if isinstance(event, payload.AdapterLoad):
                if st.lora_id == event.lora_id:
                    st.adapter = (event.start, event.end)
            elif len(st.compile) < 16:
                st.compile.append(event)


def _run_queue_mark() -> tuple[float, float] | None:
    queued = _run_queue.seconds()
    return (time.monotonic(), queued) if queued is not None else None


def _charge_engine_wait(started: tuple[float, float], scheduler_output: Any
                        ) -> tuple[float, float] | None:
    """EngineCore's wait for a CPU since ``started`` (this step, and the loop's work since the
    previous one) goes to the requests the step ran that still wait for their first token.
    Returns where the next step's window starts (``None``: none waits, or no clock)."""
    mark = _run_queue_mark()
    if mark is None:
        return None
    if mark[1] - started[1] >= _ENGINE_WAIT_MIN_S:
        wait = payload.EngineWait(started[0], mark[0], mark[1] - started[1])
        for rid in scheduler_output.num_scheduled_tokens:
            st = _state.get(rid)
            if st is not None and len(st.engine_waits) < 64:
                st.engine_waits.append(wait)
    return mark


def _charge_steps(timed: list[worker.PrefillStep]) -> None:
    """Each timed step goes to the requests whose prefill it ran (and still wait for their first
    token)."""
    for step in timed:
        for rid in step.request_ids:
            st = _state.get(rid)
            if st is not None and len(st.steps) < 64:
                st.steps.append(step.time)


# --- Scheduler.finish_requests: forget requests that end before any output -----------------------

def wrap_finish_requests(call: Callable[..., Any], instance: Any, args: tuple,
                         kwargs: dict) -> Any:
    result = call(*args, **kwargs)
    ids = args[0] if args else kwargs.get("request_ids")
    if ids is None:
        _state.clear()
    elif isinstance(ids, str):
        _state.pop(ids, None)
    else:
        for rid in ids:
            _state.pop(rid, None)
    return result
