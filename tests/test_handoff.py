"""The hand-off between EngineCore and its worker, timed on both sides, without a server: the
stamps EngineCore adds to a worker's timed step, a gap beyond the noise named as a wait with its
evidence and its cause (none, when nothing readable explains it), a gap within the noise not
named, a compile inside a step counted as the compile and not also as a wait, and the host
readings from this machine's real ``/proc``. The real worker, stopped and frozen during a
request, is ``test_handoff_vllm``."""

from __future__ import annotations

import pytest

from otel_ttft import semconv
from otel_ttft.diagnosis import thresholds
from otel_ttft.runtime.hooks.request import engine
from otel_ttft.runtime.hooks.request.attributes import named_waits
from otel_ttft.runtime.hooks.request.hostwait import HostClock, HostReading
from otel_ttft.runtime.hooks.request.payload import (
    CompileTime,
    EnginePayload,
    PrefillStep,
    StepTime,
    decode,
    encode,
)


def test_engine_core_stamps_the_hand_off_of_the_step_its_worker_began_after_it():
    core = engine.EngineRequests()
    core.noted["a"] = EnginePayload(1.0, 0, 0, 1, 2)
    core.handed = [2.0, 3.5]  # the next step was handed before this one's output was in
    late = StepTime(3.0, 3.01, wall=0.01, cpu=0.01)  # began 1 s after the hand-off
    earlier = StepTime(1.5, 1.6, wall=0.1, cpu=0.1)  # began before it: another hand-off's
    core.charge_steps([PrefillStep(late, ["a"]), PrefillStep(earlier, ["a"])], received=3.02)
    stamped, unstamped = core.noted["a"].steps
    assert (stamped.handed, stamped.received) == (2.0, 3.02)
    assert (unstamped.handed, unstamped.received) == (0.0, 0.0)
    core.close()


def test_a_late_hand_off_is_a_named_wait_even_when_nothing_explains_it():
    step = StepTime(11.0, 11.02, wall=0.02, cpu=0.02, handed=10.0, received=11.021)
    (wait,) = named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=[step]), scheduled=10.0)
    assert wait.start == pytest.approx(10.0)  # from the hand-off it waited through
    assert wait.seconds == pytest.approx(1.001, abs=1e-6)
    assert wait.evidence[semconv.ATTR_STEP_HANDOFF_SECONDS] == pytest.approx(1.001)
    assert wait.evidence[semconv.ATTR_WAIT_CAUSE] == semconv.WAIT_CAUSE_NOT_RUNNABLE


@pytest.mark.parametrize(("fields", "cause"), [
    ({"steal": 0.9}, semconv.WAIT_CAUSE_STEAL),
    ({"throttled": 0.8}, semconv.WAIT_CAUSE_THROTTLED),
    ({"major_faults": 5000}, semconv.WAIT_CAUSE_MAJOR_FAULTS),
    ({"queued_before": 0.95}, semconv.WAIT_CAUSE_RUN_QUEUE),
])
def test_the_readings_name_the_cause(fields, cause):
    step = StepTime(11.0, 11.02, wall=0.02, cpu=0.02, handed=10.0, received=11.021, **fields)
    (wait,) = named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=[step]), scheduled=10.0)
    assert wait.evidence[semconv.ATTR_WAIT_CAUSE] == cause
    assert wait.seconds == pytest.approx(1.001, abs=1e-6)  # one wait, read several ways


def test_a_hand_off_within_the_noise_is_no_wait():
    quick = thresholds.HANDOFF_MIN_SECONDS * 0.8
    step = StepTime(10.0 + quick, 10.02 + quick, wall=0.02, cpu=0.019, handed=10.0,
                    received=10.02 + quick)
    assert named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=[step]), scheduled=10.0) == []


def test_a_compile_inside_a_step_is_the_compile_not_also_a_wait():
    # 14.6 s of Inductor (its workers compile; the worker thread waits for them) in a 15 s step
    step = StepTime(10.0, 25.0, wall=15.0, cpu=1.4, handed=9.999, received=25.001)
    compile_ = CompileTime(10.2, 24.8, "vocab_parallel_embedding.py:get_masked_input_and_mask",
                           "0/0", False, False, 2, 1)
    eng = EnginePayload(9.0, 0, 0, 1, 2, compile=[compile_], steps=[step])
    assert named_waits(eng, scheduled=9.99) == []
    # without the compile the same step reads as a 13.6 s wait (what it did before)
    (wait,) = named_waits(EnginePayload(9.0, 0, 0, 1, 2, steps=[step]), scheduled=9.99)
    assert wait.seconds == pytest.approx(13.6)


def test_the_stamps_ride_the_payload():
    step = StepTime(11.0, 11.02, wall=0.02, cpu=0.02, handed=10.0, received=11.021,
                    major_faults=3, steal=0.25, throttled=0.5)
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[step])
    assert decode(encode(eng)).steps == [step]


def test_the_host_readings_come_from_this_machine():
    clock = HostClock()
    try:
        first = clock.read()
        bytearray(64 << 20)  # touch memory: minor faults only; majors need a page-in
        second = clock.read()
    finally:
        clock.close()
    assert isinstance(first, HostReading)
    assert second.major_faults >= first.major_faults >= 0
    assert second.steal_s >= first.steal_s >= 0.0
    with open("/proc/stat") as f:
        steal_ticks = int(f.readline().split()[8])
    assert second.steal_s == pytest.approx(steal_ticks / 100, abs=5.0)  # USER_HZ 100 here
    assert second.throttled_s >= 0.0


def test_engine_cores_own_wait_read_from_the_hand_off_is_one_wait_caused_by_its_run_queue():
    """EngineCore's thread starved after the worker's output left: its run-queue delay and the
    hand-off back read the same wait, counted once (the longer), caused by the run queue."""
    from otel_ttft.runtime.hooks.request.payload import EngineWait

    step = StepTime(10.01, 10.03, wall=0.02, cpu=0.02, handed=10.0, received=11.1)
    eng = EnginePayload(9.0, 0, 0, 1, 2, steps=[step],
                        engine_waits=[EngineWait(9.99, 11.12, queued=0.95)])
    (wait,) = named_waits(eng, scheduled=9.99)
    assert wait.seconds == pytest.approx(1.07 + 0.01, abs=1e-6)  # the hand-off: 10.03 -> 11.1
    assert wait.evidence[semconv.ATTR_WAIT_CAUSE] == semconv.WAIT_CAUSE_RUN_QUEUE
    assert wait.evidence[semconv.ATTR_ENGINE_QUEUED_SECONDS] == 0.95
