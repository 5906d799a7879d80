"""The one clock: monotonic readings map to epoch ns consistently, process start is found."""

from __future__ import annotations

import subprocess
import sys
import time

from otel_ttft.runtime import clock


def test_now_is_epoch_on_the_monotonic_clock():
    before = time.time_ns()
    now = clock.now_ns()
    after = time.time_ns()
    # Same instant on two clocks mapped once: within a millisecond unless NTP stepped meanwhile.
    assert before - 1_000_000 <= now <= after + 1_000_000


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
