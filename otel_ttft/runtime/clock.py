"""One clock for every process: CLOCK_MONOTONIC, mapped once per process to epoch nanoseconds.

CLOCK_MONOTONIC is host-wide on Linux, so timestamps taken in the API server, EngineCore and
workers (vLLM's ``queued_ts``/``scheduled_ts`` included) line up, and a later NTP step cannot
tear a trace: the offset is fixed when this module is imported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

_NS = 1_000_000_000


def _measure_offset_ns(samples: int = 5) -> int:
    """epoch_ns - monotonic_ns, from the tightest of a few back-to-back reads."""
    best_gap, best_offset = None, 0
    for _ in range(samples):
        m0 = time.monotonic_ns()
        wall = time.time_ns()
        m1 = time.monotonic_ns()
        gap = m1 - m0
        if best_gap is None or gap < best_gap:
            best_gap, best_offset = gap, wall - (m0 + m1) // 2
    return best_offset


EPOCH_OFFSET_NS: int = _measure_offset_ns()


def now_ns() -> int:
    """Epoch nanoseconds on the monotonic clock."""
    return time.monotonic_ns() + EPOCH_OFFSET_NS


def monotonic_to_epoch_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading (from any process on this host) as epoch ns."""
    return int(monotonic_s * _NS) + EPOCH_OFFSET_NS


def epoch_ns_to_monotonic(epoch_ns: int) -> float:
    return (epoch_ns - EPOCH_OFFSET_NS) / _NS


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Time covered by these (start, end) intervals, overlaps counted once: the wall time of
    parallel shard reads, the share of a span its children cover (analysis)."""
    total, cur_start, cur_end = 0, 0, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def process_start_monotonic(pid: int | None = None) -> float | None:
    """When the process was exec'd, as a ``time.monotonic()`` value; None off Linux.

    /proc/PID/stat field 22 counts clock ticks since boot (CLOCK_BOOTTIME); the boottime ->
    monotonic difference is read now, so suspend time before the start does not skew it.
    """
    path = f"/proc/{pid or 'self'}/stat"
    try:
        with open(path, "rb") as f:
            stat = f.read().decode()
        fields = stat[stat.rindex(")") + 2:].split()
        start_ticks = int(fields[19])  # field 22 overall; fields[0] is field 3
        ticks = os.sysconf("SC_CLK_TCK")
        boot_minus_mono = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
        return start_ticks / ticks - boot_minus_mono
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_start_ns(pid: int | None = None) -> int | None:
    start = process_start_monotonic(pid)
    return None if start is None else monotonic_to_epoch_ns(start)
