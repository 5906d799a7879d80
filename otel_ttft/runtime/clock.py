"""One clock for every process: CLOCK_MONOTONIC, mapped to epoch nanoseconds by one offset.

CLOCK_MONOTONIC is host-wide on Linux, so timestamps taken in the API server, EngineCore and
workers (vLLM's ``queued_ts``/``scheduled_ts`` included) line up if every process adds the same
offset. The wall clock steps (NTP, a VM restored from a snapshot steps it by seconds), so an
offset measured in each process would tear a trace whose processes started on either side of a
step. The first process of a tree measures it and hands it down in ``OTEL_TTFT_CLOCK_OFFSET``
(with the boot id: the monotonic clock restarts at boot): a replay, the vLLM servers it starts,
their EngineCore and workers all read one clock.

Importing this module reads the offset (inherited, else measured) and writes nothing: an
instrumented process hands it down while it is instrumented (the ``clock`` part, ``HandDown``),
a tool that starts servers puts ``handed_down()`` in their environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from otel_ttft.runtime.environment_variables import OTEL_TTFT_CLOCK_OFFSET

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


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _inherited_offset_ns(value: str | None, boot_id: str) -> int | None:
    """The offset a parent handed down, if it was measured since this boot."""
    if not value or not boot_id:
        return None
    got_boot, sep, offset = value.rpartition(":")
    if not sep or got_boot != boot_id:
        return None
    try:
        return int(offset)
    except ValueError:
        return None


def _shared_offset_ns() -> int:
    """The tree's offset: inherited, else measured here."""
    inherited = _inherited_offset_ns(os.environ.get(OTEL_TTFT_CLOCK_OFFSET), _BOOT_ID)
    return inherited if inherited is not None else _measure_offset_ns()


_BOOT_ID = _boot_id()
EPOCH_OFFSET_NS: int = _shared_offset_ns()


def handed_down() -> dict[str, str]:
    """The environment a child needs to read this process's clock (none off Linux)."""
    return {OTEL_TTFT_CLOCK_OFFSET: f"{_BOOT_ID}:{EPOCH_OFFSET_NS}"} if _BOOT_ID else {}


class HandDown:
    """The ``clock`` part: while instrumented, this process's offset is in ``os.environ`` for
    the children vLLM spawns (EngineCore, workers) to inherit. Closing it takes it back out,
    unless it was there before (handed down to us) or someone changed it since."""

    def __init__(self, process_state: object = None) -> None:
        self.set_value: str | None = None
        for name, value in handed_down().items():
            if os.environ.get(name) != value:
                os.environ[name] = self.set_value = value

    def close(self) -> None:
        if self.set_value is not None and os.environ.get(OTEL_TTFT_CLOCK_OFFSET) == self.set_value:
            del os.environ[OTEL_TTFT_CLOCK_OFFSET]
        self.set_value = None


PART = "clock"


def now_ns() -> int:
    """Epoch nanoseconds on the monotonic clock."""
    return time.monotonic_ns() + EPOCH_OFFSET_NS


_WALL_SLACK_NS = 1_000_000


def from_wall_ns(wall_ns: int) -> int:
    """A wall-clock reading taken just now (``time.time_ns()``: the SDK's default span times,
    vLLM's ``time.time()``) on this clock. Off by whatever the wall clock stepped since the
    offset was measured; within a millisecond of it, taken as it is (no jitter between a span
    and its children)."""
    drift = time.time_ns() - time.monotonic_ns() - EPOCH_OFFSET_NS
    return wall_ns - drift if abs(drift) > _WALL_SLACK_NS else wall_ns


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
