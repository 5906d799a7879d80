"""EngineCore side of the request path: count, never build spans. Per request, at
``Scheduler.add_request``, the queue depth and free KV blocks; admission attempts (each
prefix-cache lookup while it waits for blocks); the schedule times vLLM would record as events,
only when its stats logging is off; EngineCore's own wait for a CPU in each step (``runqueue``);
and what a worker handed over with a step's output (warm-up, CPU steps, CUDA-graph decisions),
charged to the requests that waited for their first token when it started. All of it rides to
the API process as the ``payload`` of the request's first ``EngineCoreOutput``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request import payload
from otel_ttft.runtime.hooks.request.payload import (
    PREEMPTED,
    SCHEDULED,
    WORKER_NOTES_ATTR,
    EnginePayload,
    PrefillStep,
)
from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock

_MAX_TRACKED = 65536
#: one warm request in this many ships its prompt's block hashes (the prefix baseline's sample);
#: every request of the cold window does
PREFIX_SAMPLE_EVERY = 8
_ENGINE_WAIT_MIN_S = 0.001  # shorter waits are not shipped (the verdict's bar is higher)


class EngineRequests:
    """EngineCore's part: per request, what it noted from arrival at the scheduler until its
    first output; whether some scheduler here runs with vLLM's stats logging off; EngineCore's
    run-queue clock and where the current step's window began."""

    def __init__(self, cold_requests: int = 0, activations: Any = None) -> None:
        self.noted: dict[str, EnginePayload] = {}
        self.cold_requests = cold_requests
        self.cold_left = cold_requests  # requests since this EngineCore started, still cold
        self.arrivals = 0
        self.activations = activations  # the activation part: a wake-up is its ``latest``
        self.counted: Any = None
        self.own_admission_times = False
        self.run_queue = RunQueueClock()  # EngineCore's thread: its wait for a CPU
        self.step_start: tuple[float, float] | None = None  # (monotonic, run-queue s) at schedule
        # when the latest steps were handed to the workers (schedule returned), oldest first:
        # with async scheduling the next step is handed before the last one's output is in
        self.handed: deque[float] = deque(maxlen=8)

    def close(self) -> None:
        self.run_queue.close()
        self.noted.clear()
        self.step_start = None
        self.handed.clear()

    def arrived(self, rid: str, entry: EnginePayload) -> None:
        if len(self.noted) >= _MAX_TRACKED:
            for key in list(self.noted)[: _MAX_TRACKED // 2]:
                self.noted.pop(key, None)
        self.noted[rid] = entry

    def wants_prefix(self) -> bool:
        """Whether this arriving request's block hashes ride to the API server: every one of
        the first ``cold_requests`` since EngineCore started or woke (the ones a cold prefix
        cache may have cost), and one in ``PREFIX_SAMPLE_EVERY`` after (what warm requests
        find cached: the baseline). The rest cost a counter."""
        latest = self.activations.latest if self.activations is not None else None
        if latest is not self.counted:  # a wake-up here: its first requests are cold again
            self.counted, self.cold_left = latest, self.cold_requests
        if self.cold_left > 0:
            self.cold_left -= 1
            return True
        self.arrivals += 1
        return self.arrivals % PREFIX_SAMPLE_EVERY == 0

    def run_queue_mark(self) -> tuple[float, float] | None:
        queued = self.run_queue.seconds()
        return (time.monotonic(), queued) if queued is not None else None

    def charge_notes(self, notes: list[Any]) -> None:
        """Each warm-up interval goes to the requests already queued when it started (an
        adapter's load: only to those for that adapter); a CUDA-graph decision to the requests
        its step started."""
        noted = self.noted
        for event in notes:
            if isinstance(event, payload.GraphDispatch):
                for rid in event.request_ids:
                    st = noted.get(rid)
                    if st is not None and st.graph is None:
                        st.graph = event.choice
                continue
            for st in noted.values():
                if st.queued > event.start:
                    continue
                if isinstance(event, payload.AdapterLoad):
                    if st.lora_id == event.lora_id:
                        st.adapter = (event.start, event.end)
                elif len(st.compile) < 16:
                    st.compile.append(event)

    def charge_engine_wait(self, started: tuple[float, float], scheduler_output: Any
                           ) -> tuple[float, float] | None:
        """EngineCore's wait for a CPU since ``started`` (this step, and the loop's work since
        the previous one) goes to the requests the step ran that still wait for their first
        token. Returns where the next step's window starts (``None``: no clock)."""
        mark = self.run_queue_mark()
        if mark is None:
            return None
        if mark[1] - started[1] >= _ENGINE_WAIT_MIN_S:
            wait = payload.EngineWait(started[0], mark[0], mark[1] - started[1])
            for rid in scheduler_output.num_scheduled_tokens:
                st = self.noted.get(rid)
                if st is not None and len(st.engine_waits) < 64:
                    st.engine_waits.append(wait)
        return mark

    def hand_off(self) -> None:
        """A step goes to the workers now (while some request waits for its first token)."""
        self.handed.append(time.monotonic())

    def charge_steps(self, timed: list[PrefillStep], received: float = 0.0) -> None:
        """Each timed step goes to the requests whose prefill it ran (and still wait for their
        first token), with the hand-off's two stamps on EngineCore's side: when it handed the
        step over (if the worker began it after that) and when it had the output."""
        for step in timed:
            time_ = step.time
            # the latest hand-off before the worker began: never earlier than the step's own
            # (a late step's gap may read short, never long)
            handed = max((h for h in self.handed if h <= time_.start), default=0.0)
            if handed and (not received or received >= time_.end):
                time_ = msgspec.structs.replace(time_, handed=handed, received=received)
            for rid in step.request_ids:
                st = self.noted.get(rid)
                if st is not None and len(st.steps) < 64:
                    st.steps.append(time_)


# --- Scheduler.add_request: arrival at the engine ------------------------------------------------

def wrap_scheduler_add_request(part: EngineRequests, call: Callable[..., Any], instance: Any,
                               args: tuple, kwargs: dict) -> Any:
    request = args[0] if args else kwargs["request"]
    rid = request.request_id
    if not instance.log_stats:
        part.own_admission_times = True
    if rid not in part.noted:
        running, waiting = instance.get_request_counts()
        pool = instance.kv_cache_manager.block_pool
        lora = request.lora_request
        entry = EnginePayload(time.monotonic(), waiting, running, pool.get_num_free_blocks(),
                              pool.num_gpu_blocks,
                              lora_id=lora.lora_int_id if lora is not None else 0)
        hashes = getattr(request, "block_hashes", None)  # vLLM's own, made with the request
        if hashes and part.wants_prefix():
            entry.block_hashes = hashes
            entry.hash_tokens = getattr(instance, "hash_block_size", 0) or 0
        part.arrived(rid, entry)
    return call(*args, **kwargs)


# --- Scheduler._get_local_prefix_cache_hit: one admission attempt -------------------------------

def wrap_prefix_lookup(part: EngineRequests, call: Any, instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """Called once per admission attempt of a request whose KV is not computed yet."""
    if part.noted:
        st = part.noted.get((args[0] if args else kwargs["request"]).request_id)
        if st is not None:
            st.attempts += 1
    return call(*args, **kwargs)


# --- Scheduler.schedule: the hand-off to the workers; admission times when vLLM records none ------

def wrap_schedule(part: EngineRequests, call: Any, instance: Any, args: tuple,
                  kwargs: dict) -> Any:
    noted = part.noted
    if not noted:
        return call(*args, **kwargs)
    if part.step_start is None:  # a request waits for its first token: time the steps
        part.step_start = part.run_queue_mark()
    if instance.log_stats or not part.own_admission_times:
        out = call(*args, **kwargs)  # vLLM stamps the events itself
        part.hand_off()  # the step goes to the workers now
        return out
    scheduled_at = time.monotonic()  # what vLLM stamps its SCHEDULED events with
    out = call(*args, **kwargs)
    part.hand_off()
    ids = [r.req_id for r in out.scheduled_new_reqs]
    ids.extend(out.scheduled_cached_reqs.resumed_req_ids)
    for rid in ids:
        st = noted.get(rid)
        if st is not None:
            st.schedule.append((SCHEDULED, scheduled_at))
    return out


# --- Scheduler._preempt_request: only needed when vLLM records no events -------------------------

def wrap_preempt_request(part: EngineRequests, call: Callable[..., Any], instance: Any,
                         args: tuple, kwargs: dict) -> Any:
    result = call(*args, **kwargs)
    if not instance.log_stats:
        request = args[0] if args else kwargs["request"]
        timestamp = args[1] if len(args) > 1 else kwargs.get("timestamp", time.monotonic())
        st = part.noted.get(request.request_id)
        if st is not None:
            st.schedule.append((PREEMPTED, timestamp))
    return result


# --- Scheduler.update_from_output: ship the payload with each request's first output --------------

def wrap_update_from_output(part: EngineRequests, call: Any, instance: Any, args: tuple,
                            kwargs: dict) -> Any:
    """Each request's first output carries what EngineCore noted (``payload``: the one way from
    EngineCore to the API server), and what a worker handed over with the step's output is
    charged to the requests waiting for their first token."""
    received = time.monotonic() if part.noted else 0.0  # EngineCore has the step's output
    outputs = call(*args, **kwargs)
    runner_output = args[1] if len(args) > 1 else kwargs.get("model_runner_output")
    handed = getattr(runner_output, WORKER_NOTES_ATTR, None)
    noted = part.noted
    if not noted and handed is None:
        part.step_start = None
        return outputs
    if part.step_start is not None:
        scheduled = args[0] if args else kwargs["scheduler_output"]
        part.step_start = part.charge_engine_wait(part.step_start, scheduled)
    if handed is not None:
        if handed.notes:
            part.charge_notes(handed.notes)
        if handed.steps:
            part.charge_steps(handed.steps, received)
    for engine_outputs in outputs.values():
        for out in engine_outputs.outputs:
            st = noted.pop(out.request_id, None)
            if st is None:
                continue
            headers = dict(out.trace_headers) if out.trace_headers else {}
            headers[semconv.ENGINE_PAYLOAD_HEADER] = payload.encode(st)
            out.trace_headers = headers
    if not noted:
        part.step_start = None
        part.handed.clear()
    return outputs


# --- Scheduler.finish_requests: forget requests that end before any output -----------------------

def wrap_finish_requests(part: EngineRequests, call: Callable[..., Any], instance: Any,
                         args: tuple, kwargs: dict) -> Any:
    result = call(*args, **kwargs)
    ids = args[0] if args else kwargs.get("request_ids")
    if ids is None:
        part.noted.clear()
    elif isinstance(ids, str):
        part.noted.pop(ids, None)
    else:
        for rid in ids:
            part.noted.pop(rid, None)
    return result
