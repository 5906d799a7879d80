"""An activation's record, as the runtime keeps it (``activation_history``, ``activation_ledger``):
the stage spans it is tiled by, the facts a change is computed from, and whether a record read
from a file can be judged. Light on purpose (``semconv`` only): the runtime imports it at start-up,
while the rule (``activation``) loads only when a verdict is taken.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from otel_ttft import semconv

MAX_SECONDS = 1e6  # a duration beyond this (eleven days) is a broken clock, not a start

# Activation attributes a concrete change is computed from (``change``): the largest value seen
# in the activation, by fact name. ``analyze`` reads the same from a trace (``breakdown``).
FACT_ATTRIBUTES = {
    "kv_blocks": semconv.ATTR_KV_BLOCKS, "kv_block_size": semconv.ATTR_KV_BLOCK_SIZE,
    "kv_bytes": semconv.ATTR_KV_BYTES, "model_bytes": semconv.ATTR_LOAD_MODEL_BYTES,
    "available_kv_bytes": semconv.ATTR_PROFILE_AVAILABLE_KV_BYTES,
    "device_memory_bytes": semconv.ATTR_DEVICE_MEMORY_BYTES,
    "host_memory_bytes": semconv.ATTR_HOST_MEMORY_BYTES,
    "device_type": semconv.ATTR_DEVICE_TYPE, "compile_cache_dir": semconv.ATTR_COMPILE_CACHE_DIR,
    "graph_batch_sizes": semconv.ATTR_GRAPH_BATCH_SIZES,
    "kv_groups": semconv.ATTR_KV_GROUPS, "kv_sequence_groups": semconv.ATTR_KV_SEQUENCE_GROUPS,
    "kv_window_blocks": semconv.ATTR_KV_WINDOW_BLOCKS,
}

@dataclass(frozen=True)
class Interval:
    """One stage span: epoch ns on the one clock the processes of a server share."""

    start_ns: int
    end_ns: int
    stage: str


def stage_seconds(intervals: Iterable[Interval], lo: int, hi: int,
                  default: str = semconv.STAGE_WARMUP) -> dict[str, float]:
    """``[lo, hi]`` tiled by the intervals, the most specific at each instant (a sub-stage over
    a family, then the one that began last: the innermost of nested spans); time none covers is
    ``default`` (start-up containers). The values add up to ``hi - lo``."""
    spans = sorted((i for i in intervals if i.end_ns > lo and i.start_ns < hi
                    and i.end_ns > i.start_ns), key=lambda i: i.start_ns)
    bounds = sorted({lo, hi, *(max(lo, min(hi, x)) for i in spans for x in (i.start_ns,
                                                                             i.end_ns))})
    out: dict[str, float] = {}
    active: list[Interval] = []  # a sweep: open at the current instant (a few: nesting depth)
    nxt = 0
    for a, b in zip(bounds, bounds[1:], strict=False):
        while nxt < len(spans) and spans[nxt].start_ns <= a:
            active.append(spans[nxt])
            nxt += 1
        active = [i for i in active if i.end_ns >= b]
        best = max(active, key=lambda i: ("." in i.stage, i.start_ns, -i.end_ns), default=None)
        stage = best.stage if best is not None else default
        out[stage] = out.get(stage, 0.0) + (b - a) / 1e9
    return out


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= MAX_SECONDS else None


def valid_record(data: Any) -> bool:
    """Whether ``data`` (from a file anyone could have written) is a record this module can
    judge: the types it reads, finite non-negative durations."""
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        return False
    if _seconds(data.get("duration_s")) is None or not isinstance(data.get("stages"), dict):
        return False
    if not all(isinstance(k, str) and _seconds(v) is not None for k, v in data["stages"].items()):
        return False
    cold = data.get("cold")
    if cold is not None and not (isinstance(cold, dict) and _seconds(cold.get("ttft_s")) is not None
                                 and isinstance(cold.get("stages"), dict)
                                 and all(isinstance(k, str) and _seconds(v) is not None
                                         for k, v in cold["stages"].items())):
        return False
    return all(isinstance(data.get(k, {}), dict) for k in ("evidence", "facts"))
