"""The EngineCore -> API payload: what EngineCore noted about one request until its first output.

It rides back as one entry (``semconv.ENGINE_PAYLOAD_HEADER``) in the ``trace_headers`` of the
request's first ``EngineCoreOutput``, a ``dict[str, str]`` vLLM already sends per output; the API
side removes the entry again before vLLM reads it. The value is a versioned JSON array, so this
module is all the API process needs to read it (no EngineCore hook module imported there), and a
value it does not understand (another version, a client's forged header, garbage) reads as
``None``: the request is then reported without EngineCore's counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

VERSION = 1
SCHEDULED, PREEMPTED = "S", "P"  # schedule event kinds (same letters as ``timeline``)


@dataclass(slots=True)
class EnginePayload:
    """One request as EngineCore saw it (all times ``time.monotonic()`` seconds, host-wide)."""

    queued: float
    """When ``Scheduler.add_request`` received it."""
    waiting: int
    """Requests waiting in the scheduler when it arrived."""
    running: int
    """Requests running when it arrived."""
    free: int
    """Free KV-cache blocks when it arrived."""
    total: int
    """KV-cache blocks in all."""
    attempts: int = 0
    """Admission attempts: prefix-cache lookups made for it while it waited for KV blocks."""
    schedule: list[tuple[str, float]] = field(default_factory=list)
    """(``SCHEDULED``|``PREEMPTED``, time), stamped by us only when vLLM records no events."""
    adapter: tuple[float, float] | None = None
    """(start, end) of a LoRA adapter load it waited for."""
    compile: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of each torch.compile paid inside its wait for the first token."""
    lora_id: int = 0
    """Its adapter's ``lora_int_id`` (0: none). EngineCore-side only: not shipped."""


def encode(p: EnginePayload) -> str:
    """The header value: ``[VERSION, queued, attempts, waiting, running, free, total, schedule,
    adapter, compile]`` as compact JSON."""
    return json.dumps([VERSION, p.queued, p.attempts, p.waiting, p.running, p.free, p.total,
                       p.schedule, p.adapter, p.compile], separators=(",", ":"))


def _time(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a time: {value!r}")
    return float(value)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _interval(value: object) -> tuple[float, float]:
    start, end = value  # type: ignore[misc]
    return _time(start), _time(end)


def decode(value: str) -> EnginePayload | None:
    """The API side's reading of :func:`encode`; ``None`` for anything else."""
    if not isinstance(value, str) or len(value) > 65536:
        return None
    try:
        data = json.loads(value)
        if not isinstance(data, list) or len(data) != 10 or data[0] != VERSION:
            return None
        _, queued, attempts, waiting, running, free, total, schedule, adapter, compile_ = data
        events = []
        for kind, ts in schedule:
            if kind not in (SCHEDULED, PREEMPTED):
                return None
            events.append((kind, _time(ts)))
        return EnginePayload(
            queued=_time(queued), attempts=_count(attempts), waiting=_count(waiting),
            running=_count(running), free=_count(free), total=_count(total), schedule=events,
            adapter=None if adapter is None else _interval(adapter),
            compile=[_interval(c) for c in compile_])
    except (ValueError, TypeError, RecursionError):
        return None
