"""Contention against a real vLLM (CPU build, tiny local model), two ways in one server:

- the worker is stopped for a second by the kernel (SIGSTOP, then SIGCONT from another process)
  inside the step that runs one request's prefill: that request's tree names the wait
  (``prefill.wait``) with its evidence, the worker thread's CPU seconds against the step's wall
  seconds;
- another process spins on EngineCore's CPU for a second while EngineCore's thread, at the
  lowest priority, handles the output of a marked request's first step: the thread waits on the
  kernel's run queue, in ``Scheduler.update_from_output``, outside the worker's calls (as a
  second vLLM server's busy loop on the same core makes it wait): the wait is named from the
  run-queue delay.

Each ``Prefill`` keeps the rest, and the requests around them, run the same way, name no wait."""

from __future__ import annotations

import pytest

from otel_ttft import semconv
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.test_request_vllm import (
    assert_tiles_ttft,
    by_trace,
    children,
    complete,
    token_prompt,
    wait_for_requests,
)

pytestmark = pytest.mark.vllm

TRIGGER = [1999, 1998, 1997, 1996, 1995]  # prompt ids the plant stops the worker for
HOG_TRIGGER = [1989, 1988, 1987, 1986, 1985]  # ... and makes EngineCore's thread wait for a CPU
STOP_S = 1.0
HOG_S = 1.0

# A general plugin (loaded in every vLLM process): inside the model runner's execute_model, when
# the step's new requests include one whose prompt starts with TRIGGER, the process stops itself
# (SIGSTOP: no thread of it runs) and a shell it started continues it a second later.
PLANT = f'''
import os, signal, subprocess, threading, time

TRIGGER = {TRIGGER!r}
HOG_TRIGGER = {HOG_TRIGGER!r}
STOP_S = {STOP_S!r}
HOG_S = {HOG_S!r}


def _starve_this_thread():
    """Another process spins on this thread's CPU for HOG_S while this thread, at the lowest
    priority, needs 20 ms of CPU: it waits on the run queue until the spinner is gone."""
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {{cpu}})  # this thread only
    hog = subprocess.Popen(["timeout", str(HOG_S), "sh", "-c", "while :; do :; done"],
                           preexec_fn=lambda: os.sched_setaffinity(0, {{cpu}}))
    time.sleep(0.05)  # the spinner is up
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, 19)
    start = time.thread_time()
    while time.thread_time() - start < 0.02:
        pass
    hog.wait()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 0)
    except PermissionError:  # not root: this thread stays at 19, nothing else spins
        pass
    os.sched_setaffinity(0, mine)


def register():
    from vllm.v1.core.sched import scheduler as sched

    cls = sched.Scheduler
    if not getattr(cls, "_ttft_test_hog_planted", False):
        cls._ttft_test_hog_planted = True
        inner_update = cls.update_from_output

        def update_from_output(self, scheduler_output, *args, **kwargs):
            for new in scheduler_output.scheduled_new_reqs:
                if list(new.prompt_token_ids or [])[:len(HOG_TRIGGER)] == HOG_TRIGGER:
                    _starve_this_thread()
            return inner_update(self, scheduler_output, *args, **kwargs)

        cls.update_from_output = update_from_output

    from vllm.v1.worker import gpu_model_runner as gmr

    runner = gmr.GPUModelRunner
    if getattr(runner, "_ttft_test_stop_planted", False):
        return
    runner._ttft_test_stop_planted = True
    inner = runner.execute_model

    def execute_model(self, scheduler_output, *args, **kwargs):
        for new in scheduler_output.scheduled_new_reqs:
            if list(new.prompt_token_ids or [])[:len(TRIGGER)] == TRIGGER:
                subprocess.Popen(["sh", "-c", f"sleep {{STOP_S}}; kill -CONT {{os.getpid()}}"])
                os.kill(os.getpid(), signal.SIGSTOP)
        return inner(self, scheduler_output, *args, **kwargs)

    runner.execute_model = execute_model
'''


def test_a_worker_stopped_or_starved_inside_a_prefill_is_a_named_wait(receiver, tiny_model,
                                                                     tmp_path, vllm_plugin):
    model = str(tiny_model)
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_TTFT_REQUEST_DETAIL": semconv.DETAIL_SPANS,
           "PYTHONPATH": vllm_plugin("ttft_test_stop", PLANT)}
    with VllmServer(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        before = [complete(server.url, model, token_prompt(40, seed=i)) for i in range(2)]
        stopped = complete(server.url, model, TRIGGER + token_prompt(40, seed=7))
        between = complete(server.url, model, token_prompt(40, seed=8))
        starved = complete(server.url, model, HOG_TRIGGER + token_prompt(40, seed=9))
        after = [complete(server.url, model, token_prompt(40, seed=20 + i)) for i in range(2)]
        wait_for_requests(receiver, 7)
    spans = receiver.store.spans()
    reqs = by_trace(spans, [*before, stopped, between, starved, *after])

    (req,) = reqs[stopped.trace_id]
    attrs = req["attributes"]
    parts = assert_tiles_ttft(spans, req)
    prefill = next(p for p in parts if p["name"] == semconv.SPAN_REQUEST_PREFILL)
    waits = [c for c in children(spans, prefill) if c["name"] == semconv.SPAN_PREFILL_WAIT]
    assert len(waits) == 1, [c["name"] for c in children(spans, prefill)]
    (wait,) = waits
    evidence = wait["attributes"]
    assert evidence[semconv.ATTR_STAGE] == semconv.STAGE_PREFILL_WAIT
    # The kernel stopped every thread for STOP_S: the step's wall time holds it, the worker
    # thread's CPU time does not.
    wall, cpu = evidence[semconv.ATTR_STEP_WALL_SECONDS], evidence[semconv.ATTR_STEP_CPU_SECONDS]
    assert wall >= STOP_S
    assert wall - cpu >= STOP_S * 0.9
    assert evidence[semconv.ATTR_STEP_CPU_RATIO] == pytest.approx(cpu / wall)
    # The wait is the stop, plus what the worker waited on the run queue to wake up for the
    # step (its run-queue reading: microseconds on a quiet machine).
    queued = evidence[semconv.ATTR_STEP_QUEUED_SECONDS]
    wait_s = (wait["end_ns"] - wait["start_ns"]) / 1e9
    assert wall - cpu - 1e-6 <= wait_s <= wall - cpu + queued + 1e-6
    assert prefill["start_ns"] <= wait["start_ns"] <= wait["end_ns"] <= prefill["end_ns"]
    # The request names it too, and its prefill is the stop plus the step's own work.
    assert attrs[semconv.ATTR_REQUEST_WAIT_SECONDS] == pytest.approx(wait_s, abs=1e-6)
    assert attrs[semconv.ATTR_STEP_CPU_RATIO] < 0.5
    assert attrs[semconv.ATTR_REQUEST_STAGE_PREFILL_SECONDS] >= STOP_S

    # Starved in Scheduler.update_from_output: outside the worker's calls, so its wall-against-
    # CPU reading has nothing; EngineCore's run-queue delay has the second.
    (req,) = reqs[starved.trace_id]
    attrs = req["attributes"]
    parts = assert_tiles_ttft(spans, req)
    prefill = next(p for p in parts if p["name"] == semconv.SPAN_REQUEST_PREFILL)
    (wait,) = [c for c in children(spans, prefill) if c["name"] == semconv.SPAN_PREFILL_WAIT]
    queued = wait["attributes"][semconv.ATTR_ENGINE_QUEUED_SECONDS]
    assert queued >= HOG_S * 0.8, wait["attributes"]
    # The same wait read from the hand-off too (the worker's output left, EngineCore had it only
    # after the spinner and the plant's own 70 ms of sleep and spin): one wait, the longer reading.
    wait_s = (wait["end_ns"] - wait["start_ns"]) / 1e9
    handoff = wait["attributes"].get(semconv.ATTR_STEP_HANDOFF_SECONDS, 0.0)
    assert wait_s == pytest.approx(max(queued, handoff), abs=0.01), wait["attributes"]
    assert wait_s <= queued + 0.2
    assert wait["attributes"][semconv.ATTR_WAIT_CAUSE] == semconv.WAIT_CAUSE_RUN_QUEUE
    assert prefill["start_ns"] <= wait["start_ns"] <= wait["end_ns"] <= prefill["end_ns"]
    assert attrs[semconv.ATTR_REQUEST_WAIT_SECONDS] == pytest.approx(wait_s, abs=1e-3)
    assert attrs[semconv.ATTR_ENGINE_QUEUED_SECONDS] >= queued

    # The same requests, neither stopped nor starved: timed, and neither charged to any of them
    # (this machine is shared, so a few milliseconds of real waiting may be named there, never
    # the second).
    for call in [*before, between, *after]:
        (other,) = reqs[call.trace_id]
        other_attrs = other["attributes"]
        assert other_attrs[semconv.ATTR_STEP_WALL_SECONDS] > 0
        assert other_attrs.get(semconv.ATTR_REQUEST_WAIT_SECONDS, 0.0) < STOP_S / 2
        assert other_attrs[semconv.ATTR_REQUEST_STAGE_PREFILL_SECONDS] < STOP_S / 2
