"""Contention without a server: which steps a worker times (vLLM's real ``SchedulerOutput`` and
``NewRequestData``), what EngineCore charges them to, how the wait is named, and the verdict's
fix for it. The real worker, stopped by the kernel, is ``test_contention_vllm``."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from otel_ttft import semconv
from otel_ttft.diagnosis import rule, thresholds
from otel_ttft.runtime.hooks.request import engine, worker
from otel_ttft.runtime.hooks.request.attributes import named_waits, step_evidence
from otel_ttft.runtime.hooks.request.payload import (
    EnginePayload,
    EngineWait,
    PrefillStep,
    StepTime,
)
from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock
from otel_ttft.runtime.hooks.request.spans import wait_spans

pytestmark = pytest.mark.vllm_import

CPU = SimpleNamespace(device=SimpleNamespace(type="cpu"))
PAUSE_S = 0.05  # the stand-in step sleeps: wall time its thread does not run


part: worker.WorkerSteps
core: engine.EngineRequests


@pytest.fixture(autouse=True)
def _fresh_parts():
    """A fresh worker part (``part``) and EngineCore part (``core``) for each test."""
    global part, core
    part, core = worker.WorkerSteps(), engine.EngineRequests()
    yield
    part.close()
    core.close()


def _taken():
    """The steps the worker timed, taken (what its next output would carry)."""
    return worker._take(part.steps) or None


def _output(new: dict[str, tuple[int, int]] | None = None, cached: dict[str, int] | None = None,
            finished: set[str] = frozenset()):
    """A real SchedulerOutput: ``new`` id -> (prompt tokens, scheduled), ``cached`` id ->
    scheduled."""
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    so = SchedulerOutput.make_empty()
    for rid, (prompt, n) in (new or {}).items():
        so.scheduled_new_reqs.append(NewRequestData(
            req_id=rid, prompt_token_ids=list(range(prompt)), mm_features=[],
            sampling_params=None, pooling_params=None, block_ids=([],), num_computed_tokens=0,
            lora_request=None))
        so.num_scheduled_tokens[rid] = n
    for rid, n in (cached or {}).items():
        so.num_scheduled_tokens[rid] = n
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
    so.finished_req_ids = set(finished)
    return so


def _pause(*args, **kwargs):
    time.sleep(PAUSE_S)


def _step(so, instance=CPU) -> None:
    """One engine step as EngineCore drives a worker: execute_model, then sample_tokens."""
    worker.wrap_execute_model(part, lambda *a, **k: None, instance, (so,), {})
    worker.wrap_sample_tokens(part, _pause, instance, (None,), {})


def test_a_chunked_prefill_is_timed_step_by_step_and_a_decode_step_is_not():
    _step(_output(new={"a": (100, 60)}))
    _step(_output(cached={"a": 40}))  # its last chunk
    _step(_output(cached={"a": 1}))  # decode: nothing prefills
    timed = _taken()
    assert [s.request_ids for s in timed] == [["a"], ["a"]]
    for s in timed:
        assert s.time.wall >= PAUSE_S
        assert s.time.start < s.time.end
        assert thresholds.waited(s.time.wall, s.time.wall - s.time.cpu)  # asleep: no CPU
    assert _taken() is None


def test_steps_of_a_gpu_worker_and_finished_requests_are_not_timed():
    _step(_output(new={"a": (10, 10)}), instance=SimpleNamespace(device=SimpleNamespace(
        type="cuda")))
    assert _taken() is None
    part.cpu_worker = None
    _step(_output(new={"b": (100, 50)}))
    _step(_output(finished={"b"}))  # aborted mid-prefill: forgotten, nothing timed
    assert [s.request_ids for s in _taken()] == [["b"]]
    assert not part.prefilling


def test_engine_charges_a_step_to_the_requests_it_prefilled_while_they_wait():
    core.noted.update({"a": EnginePayload(1.0, 0, 0, 1, 2),
                          "b": EnginePayload(1.0, 0, 0, 1, 2)})
    step = StepTime(2.0, 3.1, wall=1.1, cpu=0.01)
    core.charge_steps([PrefillStep(step, ["a", "gone"])])
    assert core.noted["a"].steps == [step]
    assert core.noted["b"].steps == []


def test_a_wait_is_named_under_its_step_with_its_evidence_and_jitter_is_not():
    stopped = StepTime(10.0, 11.2, wall=1.2, cpu=0.02)
    busy = StepTime(12.0, 12.004, wall=0.004, cpu=0.0035)  # a healthy tiny step
    shared = StepTime(13.0, 13.2, wall=0.2, cpu=0.19)  # ran 95 %: no wait worth a name
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[stopped, busy, shared])
    ((name, stage, start, end, attrs),) = wait_spans(eng)
    assert (name, stage) == (semconv.SPAN_PREFILL_WAIT, semconv.STAGE_PREFILL_WAIT)
    assert end == stopped.end and end - start == pytest.approx(1.18)
    assert attrs == {**step_evidence([stopped]), semconv.ATTR_STEP_QUEUED_SECONDS: 0.0,
                     semconv.ATTR_WAIT_CAUSE: semconv.WAIT_CAUSE_NOT_RUNNABLE}
    assert attrs[semconv.ATTR_STEP_CPU_RATIO] == pytest.approx(0.02 / 1.2)
    assert wait_spans(EnginePayload(9.0, 0, 0, 1, 2)) == []
    assert wait_spans(None) == []


def test_the_verdict_fixes_a_wait_by_placement_not_context_policy():
    fix, change = rule.fix_for(semconv.STAGE_PREFILL_WAIT, semconv.STAGE_PREFILL)
    assert fix == rule.PLACEMENT
    assert fix != rule.fix_for(None, semconv.STAGE_PREFILL)[0]
    assert "CPU" in change


def test_every_platforms_worker_runs_its_steps_through_the_hooked_worker_methods():
    """The hooks sit on the GPU ``Worker``; a platform worker that overrode either method would
    run its steps untimed."""
    import importlib

    from otel_ttft.runtime.hooks import request

    targets = {h.target for h in request.HOOKS if h.stage == semconv.STAGE_PREFILL_WAIT}
    assert targets == {"vllm.v1.worker.gpu_worker:Worker.execute_model",
                       "vllm.v1.worker.gpu_worker:Worker.sample_tokens"}
    from vllm.v1.worker.gpu_worker import Worker

    checked = 0
    for module, name in (("vllm.v1.worker.cpu_worker", "CPUWorker"),
                         ("vllm.v1.worker.xpu_worker", "XPUWorker")):
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:  # a platform this build cannot import
            continue
        assert issubclass(cls, Worker)
        for method in ("execute_model", "sample_tokens"):
            assert getattr(cls, method) is getattr(Worker, method), (name, method)
        checked += 1
    assert checked >= 1  # the CPU worker, at least, is checked here


def test_an_engine_steps_run_queue_wait_is_named_and_one_wait_is_never_counted_twice():
    # EngineCore's thread waited 0.9 s in a 1 s step; the worker's step inside it read 0.5 s of
    # the same wait (its wall against its CPU): one wait of 0.9 s, with both readings.
    inner = StepTime(20.2, 20.9, wall=0.7, cpu=0.2)
    outside = StepTime(30.0, 30.5, wall=0.5, cpu=0.1)  # another process's worker step
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[inner, outside],
                        engine_waits=[EngineWait(20.0, 21.0, queued=0.9),
                                      EngineWait(25.0, 25.01, queued=0.0012)])  # jitter
    first, second = named_waits(eng)
    assert (first.start, first.seconds) == (pytest.approx(20.1), 0.9)
    assert first.evidence[semconv.ATTR_ENGINE_QUEUED_SECONDS] == 0.9
    assert first.evidence[semconv.ATTR_STEP_WALL_SECONDS] == 0.7
    assert (second.start, second.seconds) == (pytest.approx(30.1), pytest.approx(0.4))
    # Clipped at the first token: the span never leaves Prefill.
    (span, _) = wait_spans(eng, limit=20.95)
    assert span[3] == 20.95 and span[3] - span[2] == pytest.approx(0.9)
    # The worker's reading is the larger one: it stands (a stopped process is not queued).
    stopped = StepTime(40.1, 41.3, wall=1.2, cpu=0.01)
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[stopped],
                        engine_waits=[EngineWait(40.0, 41.4, queued=0.002)])
    ((wait),) = named_waits(eng)
    assert wait.seconds == pytest.approx(1.19)


def test_a_worker_that_waited_to_wake_up_for_the_step_is_named_within_the_gap_only():
    """Two CPU servers on one core: the other's busy loop holds it, and this worker, woken for
    the request's step, waits on the run queue before the step starts. Its run-queue delay since
    its previous step counts only within the gap between the request's scheduling and the
    step: what it waited before the request existed is not the request's."""
    woke_late = StepTime(51.0, 51.004, wall=0.004, cpu=0.0039, queued=0.0,
                         queued_before=1.2)  # 1.2 s queued since its last step, 1 s of it here
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[woke_late])
    (wait,) = named_waits(eng, scheduled=50.0)
    assert (wait.start, wait.seconds) == (50.0, pytest.approx(1.0001))
    assert wait.evidence[semconv.ATTR_STEP_QUEUED_SECONDS] == pytest.approx(1.0)
    # the same reading with the step right after its scheduling: nothing of it was this one's
    prompt = StepTime(50.001, 50.005, wall=0.004, cpu=0.0039, queued_before=1.2)
    assert named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=[prompt]), scheduled=50.0) == []
    # a later chunk of the same prefill: the gap is since the previous chunk ended
    chunks = [StepTime(50.0, 50.01, wall=0.01, cpu=0.0099),
              StepTime(50.51, 50.52, wall=0.01, cpu=0.0099, queued_before=0.9)]
    (wait,) = named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=chunks), scheduled=50.0)
    assert (wait.start, wait.seconds) == (pytest.approx(50.01), pytest.approx(0.5001))


def test_the_run_queue_clock_reads_this_threads_wait_and_follows_the_thread():
    import threading

    clock = RunQueueClock()
    first = clock.seconds()
    if first is None:
        pytest.skip("no /proc/thread-self/schedstat on this kernel")
    assert clock.seconds() >= first

    def own() -> float:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9

    seen = []

    def other_thread() -> None:  # the clock reads the thread that asks, not the one that opened
        seen.append((own(), clock.seconds(), own()))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    ((before, read, after),) = seen
    assert before <= read <= after
    clock.close()


def test_engine_charges_its_own_wait_to_the_requests_the_step_ran(monkeypatch):
    core.noted.update({"a": EnginePayload(1.0, 0, 0, 1, 2),
                       "b": EnginePayload(1.0, 0, 0, 1, 2)})
    scheduled = SimpleNamespace(num_scheduled_tokens={"a": 5, "gone": 3})
    now = core.run_queue_mark()
    if now is None:
        pytest.skip("no /proc/thread-self/schedstat on this kernel")
    mark = core.charge_engine_wait((now[0] - 1.0, now[1] - 0.5), scheduled)
    (wait,) = core.noted["a"].engine_waits
    assert wait.queued >= 0.5 and wait.end - wait.start >= 1.0
    assert core.noted["b"].engine_waits == []
    assert mark is not None and mark[0] >= wait.end


def test_closing_the_parts_closes_their_run_queue_files():
    """``_uninstrument`` closes the state: the ``/proc`` descriptors the clocks hold go with it."""
    import os

    if core.run_queue.seconds() is None or part.run_queue.seconds() is None:
        pytest.skip("no /proc/thread-self/schedstat on this kernel")
    fds = [*core.run_queue._fds, *part.run_queue._fds]
    assert fds
    core.close()
    part.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
