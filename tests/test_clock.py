"""The one clock: monotonic readings map to epoch ns consistently, process start is found."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from otel_ttft.runtime import clock
from tests.request_engine import our_tracer


def _fresh(code: str, **env: str) -> str:
    """Run ``code`` in a new interpreter, with ``env`` over ours but no inherited offset."""
    base = {k: v for k, v in os.environ.items() if k != clock.OTEL_TTFT_CLOCK_OFFSET}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env},
                          capture_output=True, text=True, check=True).stdout


def test_a_fresh_tree_maps_now_to_the_wall_clock():
    """Measured where nothing was handed down: the same instant as time_ns, within a ms (the
    check runs in a new process; this one's offset may predate a wall-clock step)."""
    out = _fresh("import time\n"
                 "from otel_ttft.runtime import clock\n"
                 "b = time.time_ns(); n = clock.now_ns(); a = time.time_ns()\n"
                 "print(b, n, a)")
    before, now, after = map(int, out.split())
    assert before - 1_000_000 <= now <= after + 1_000_000


def test_the_offset_is_handed_down_and_taken_as_is():
    """A process started under another's offset adds exactly that one, even when the wall clock
    says otherwise (it stepped between the two starts): their spans stay on one clock. Importing
    the clock writes nothing; the ``clock`` part hands it down while instrumented, and takes it
    back when it closes."""
    name = clock.OTEL_TTFT_CLOCK_OFFSET
    out = _fresh("import os\n"
                 "from otel_ttft.runtime import clock\n"
                 f"print('{name}' in os.environ)\n"
                 "part = clock.HandDown()\n"
                 f"print(clock.EPOCH_OFFSET_NS, os.environ['{name}'])\n"
                 "part.close()\n"
                 f"print('{name}' in os.environ)")
    before, handed_line, after = out.splitlines()
    offset, handed = handed_line.split()
    assert before == after == "False"
    assert handed == f"{clock._boot_id()}:{offset}"
    assert clock.handed_down() == {name: f"{clock._boot_id()}:{clock.EPOCH_OFFSET_NS}"}
    stepped = int(offset) + 4_000_000_000  # as if the parent measured before a 4 s step
    code = ("from otel_ttft.runtime import clock\n"
            "print(clock.EPOCH_OFFSET_NS)")
    got = _fresh(code, **{clock.OTEL_TTFT_CLOCK_OFFSET: f"{clock._boot_id()}:{stepped}"})
    assert int(got) == stepped


def test_an_offset_from_another_boot_or_garbage_is_measured_afresh():
    boot = clock._boot_id()
    assert boot
    assert clock._inherited_offset_ns(f"{boot}:123", boot) == 123
    for value in ("00000000-0000-0000-0000-000000000000:123", f"{boot}:", f"{boot}:1e9", "123",
                  "", None, f"{boot}:nan"):
        assert clock._inherited_offset_ns(value, boot) is None, value
    code = "from otel_ttft.runtime import clock\nprint(clock.EPOCH_OFFSET_NS)"
    got = _fresh(code, **{clock.OTEL_TTFT_CLOCK_OFFSET: "00000000-0000-0000-0000-000000000000:5"})
    assert abs(int(got) - clock._measure_offset_ns()) < 3600 * 10**9  # measured here, not 5


def test_monotonic_round_trip_and_ordering():
    m = time.monotonic()
    ns = clock.monotonic_to_epoch_ns(m)
    assert abs(clock.epoch_ns_to_monotonic(ns) - m) < 1e-6
    assert clock.monotonic_to_epoch_ns(m + 1.5) - ns == 1_500_000_000


def test_monotonic_reading_from_another_process_maps_to_the_same_instant():
    """CLOCK_MONOTONIC is host-wide: a child's reading lands where ours says it should."""
    before = time.monotonic()
    out = subprocess.run([sys.executable, "-c", "import time; print(repr(time.monotonic()))"],
                         capture_output=True, text=True, check=True)
    after = time.monotonic()
    child = float(out.stdout)
    assert before <= child <= after
    assert clock.monotonic_to_epoch_ns(before) <= clock.monotonic_to_epoch_ns(child)


def test_process_start_of_a_child_lies_between_spawn_and_its_first_words():
    before = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        time.sleep(0.1)
        start = clock.process_start_monotonic(proc.pid)
    finally:
        proc.wait()
    after = time.monotonic()
    assert start is not None
    tick = 1 / 100  # /proc reports start in clock ticks (USER_HZ)
    assert before - 2 * tick <= start <= after


def test_process_start_of_a_missing_pid_is_none():
    assert clock.process_start_monotonic(2**22 + 12345) is None


def test_union_counts_overlapping_intervals_once():
    assert clock.union_ns([(0, 10), (5, 20), (30, 40)]) == 30
    assert clock.union_ns(iter([(30, 40), (0, 10), (10, 15)])) == 25  # any order; touching
    assert clock.union_ns([(0, 100), (10, 20), (50, 60)]) == 100  # nested
    assert clock.union_ns([]) == 0


def test_a_wall_reading_moves_by_the_step_since_the_offset_and_no_less_than_the_slack(
        monkeypatch):
    monkeypatch.setattr(clock, "EPOCH_OFFSET_NS", clock._measure_offset_ns())
    wall = time.time_ns()
    assert clock.from_wall_ns(wall) == wall  # no step since the offset: taken as it is
    monkeypatch.setattr(clock, "EPOCH_OFFSET_NS", clock.EPOCH_OFFSET_NS - 4_000_000_000)
    assert abs(clock.from_wall_ns(wall) - (wall - 4_000_000_000)) < 1_000_000  # a 4 s step


def test_vllm_spans_move_onto_our_clock_after_a_wall_clock_step(monkeypatch):
    """vLLM stamps its start-up spans with the wall clock, we with the monotonic one: after a
    4 s step (our offset measured before it) its "Load model" still holds our shard read, and a
    span of anyone else keeps the SDK's times."""
    from opentelemetry import trace

    from otel_ttft import semconv
    from otel_ttft.runtime.state import ProcessIdentity
    from otel_ttft.runtime.telemetry import spans
    from tests.otel_memory import memory_exporter

    exporter = memory_exporter()  # through our configurator's pipeline
    exporter.clear()
    monkeypatch.setattr(clock, "EPOCH_OFFSET_NS", clock.EPOCH_OFFSET_NS - 4_000_000_000)
    tracer = trace.get_tracer("vllm.model_executor.model_loader")
    before = clock.now_ns()
    with tracer.start_as_current_span("Load model"), \
            spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ, tracer=our_tracer(),
                             identity=ProcessIdentity()):
        time.sleep(0.01)
    with tracer.start_as_current_span("someone else's"):
        pass
    with spans.stage_span(semconv.SPAN_KV_ALLOC, semconv.STAGE_WARMUP_KV_ALLOC,
                          tracer=our_tracer(), identity=ProcessIdentity()):
        pass  # vLLM's name, opened by us (where vLLM has none): on our clock already
    after = clock.now_ns()
    got = {s.name: s for s in exporter.get_finished_spans()}
    load, shard = got["Load model"], got[semconv.SPAN_SHARD_READ]
    assert before <= load.start_time <= shard.start_time < shard.end_time <= load.end_time <= after
    assert load.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD
    assert got["someone else's"].start_time > after + 3_000_000_000  # the SDK's wall clock
    ours = got[semconv.SPAN_KV_ALLOC]
    assert shard.end_time <= ours.start_time <= ours.end_time <= after
