"""An activation along its slowest rank: where an engine's workers run the same start-up stage
side by side, the start waits for the slowest of them (the others wait at the next collective),
so the stage is as long as that rank's, and the rank, the stage and how far it fell behind the
others (its skew) is what to name.

Each rank's time per stage is its own stage spans tiled (``stage_seconds``), less the time it
spent waiting for the other ranks inside a collective (intervals marked ``wait``): that wait is
the slow rank's stage, not this one's. The activation's own stage sums are unaffected (they tile
its interval once, whatever the number of ranks). Pure: the live verdict (from the ledger) and
``analyze`` (from a trace) give it the same intervals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis.record import Interval, stage_seconds
from otel_ttft.diagnosis.thresholds import RANK_SKEW_FACTOR, RANK_SKEW_MIN_SECONDS

_WAIT = "~.rank_wait"  # a sentinel sub-stage: the most specific at its instants, then dropped
_UNCOVERED = "~"


@dataclass(frozen=True)
class RankedInterval:
    """One worker stage span: its interval, stage, the worker's rank; ``wait`` when it is the
    rank waiting for the others (a collective), not work of its own."""

    start_ns: int
    end_ns: int
    stage: str
    rank: int
    wait: bool = False


def per_rank_seconds(intervals: Iterable[RankedInterval]) -> dict[int, dict[str, float]]:
    """Each rank's own seconds per stage (its spans tiled, its waits for others taken out)."""
    by_rank: dict[int, list[RankedInterval]] = {}
    for i in intervals:
        if i.end_ns > i.start_ns:
            by_rank.setdefault(i.rank, []).append(i)
    out: dict[int, dict[str, float]] = {}
    for rank, items in by_rank.items():
        lo = min(i.start_ns for i in items)
        hi = max(i.end_ns for i in items)
        tiled = stage_seconds([Interval(i.start_ns, i.end_ns, _WAIT if i.wait else i.stage)
                               for i in items], lo, hi, default=_UNCOVERED)
        out[rank] = {k: v for k, v in tiled.items() if k not in (_WAIT, _UNCOVERED)}
    return out


def skews(intervals: Iterable[RankedInterval]) -> dict[str, dict[str, Any]]:
    """Per stage, with two ranks or more: ``rank`` (the slowest), ``skew_s`` (its seconds less
    the fastest rank's), ``slowest_s``, ``fastest_s``, ``fastest_rank``."""
    seconds = per_rank_seconds(intervals)
    if len(seconds) < 2:
        return {}
    stages = {stage for per in seconds.values() for stage in per}
    out: dict[str, dict[str, Any]] = {}
    for stage in sorted(stages):
        values = {rank: per.get(stage, 0.0) for rank, per in seconds.items()}
        slow = max(values, key=lambda r: (values[r], -r))
        fast = min(values, key=lambda r: (values[r], r))
        out[stage] = {"rank": slow, "skew_s": round(values[slow] - values[fast], 6),
                      "slowest_s": round(values[slow], 6), "fastest_s": round(values[fast], 6),
                      "fastest_rank": fast}
    return out


def gate(intervals: Iterable[RankedInterval], *, factor: float = RANK_SKEW_FACTOR,
         min_seconds: float = RANK_SKEW_MIN_SECONDS) -> dict[str, Any] | None:
    """The rank that gated the start: the stage with the largest skew, when the slowest rank
    took at least ``factor`` times the fastest's time in it and ``min_seconds`` more; else None
    (ranks within the noise of each other). Keys: ``stage``, ``rank``, ``skew_s``,
    ``slowest_s``, ``fastest_s``, ``fastest_rank``, ``fix``."""
    found = skews(intervals)
    if not found:
        return None
    stage, worst = max(found.items(), key=lambda kv: kv[1]["skew_s"])
    if worst["skew_s"] < min_seconds or worst["slowest_s"] < factor * worst["fastest_s"]:
        return None
    return {"stage": stage, **worst, "fix": fix_for(stage, worst["rank"])}


# What a rank that fell behind in a stage points at: that rank's own hardware or data path,
# since the others, with the same configuration, did not.
_RANK_FIXES = {
    semconv.STAGE_LOAD: "its storage: the checkpoint path this worker reads (its disk, mount "
                        "or network link), or place the checkpoint on local storage",
    semconv.STAGE_WARMUP_DEVICE_INIT: "its device: the accelerator (or CPU cores) this worker "
                                      "was given, and its driver",
    semconv.STAGE_WARMUP_KV_ALLOC: "its device memory: what else holds memory on this worker's "
                                   "device",
    semconv.STAGE_WARMUP_PROCESS_START: "its host: the imports of this worker process (its "
                                        "file system, its CPU share)",
}


def fix_for(stage: str, rank: int) -> str:
    """What to look at, in words, for ``rank`` behind the others in ``stage``."""
    text = _RANK_FIXES.get(stage) or _RANK_FIXES.get(semconv.stage_family(stage))
    what = text or "what differs on this worker: its device, its storage, its CPU share"
    return f"rank {rank} alone was slow in {stage}: look at {what}"


def sentence(g: dict[str, Any]) -> str:
    """The gate in plain words."""
    return (f"rank {g['rank']} gated the start: {g['stage']} {g['slowest_s']:.1f} s against "
            f"{g['fastest_s']:.1f} s on rank {g['fastest_rank']} (+{g['skew_s']:.1f} s); "
            f"{g['fix']}")


def valid_gate(data: Any) -> bool:
    """Whether ``data`` (read from a file) is a gate ``sentence`` can print."""
    return (isinstance(data, dict) and isinstance(data.get("stage"), str)
            and all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool)
                    for k in ("rank", "fastest_rank"))
            and all(isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)
                    for k in ("skew_s", "slowest_s", "fastest_s"))
            and isinstance(data.get("fix"), str))
