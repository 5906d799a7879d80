"""The forecast: what a model's next first token will cost on this host if a request for it
arrived now, stage by stage, from its earlier activations here and the conditions read now.

Pure: the inputs are the live verdict's history records (``activation``'s record) and a
:class:`Conditions` the caller read (page-cache residency of the checkpoint, whether the compile
cache holds the model's artifacts, a sleeping server, the device memory, the server that would
have to leave); nothing here reads a file.

A start's first token as its user lives it is the switch (the outgoing server's eviction), the
activation (exec -> ready, tiled by its stage spans) and the first request (its own stages).
Each stage's forecast is the median of the earlier activations' seconds in it; two stages move
with the conditions:

- ``load.read`` (``load`` where no read was tiled): the bytes that must come from storage now
  (the checkpoint's size times its share not in the page cache) against those the earlier starts
  read. Where the model's own starts read different amounts, a line through them; else the
  difference times this host's storage cost per byte (measured where a model was read both cold
  and warm; else, as an upper bound, cold reads' seconds per byte).
- ``warmup.compile``: the earlier starts whose compile cache hit (or missed) as the cache now
  would.

A model never started here has no forecast ("no history"), never a number.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ttft import semconv

NO_HISTORY = "no history"
MAX_BASIS = 20  # the most recent activations a forecast rests on
THIN = 3  # fewer activations than this: no spread to measure, the range is widened
THIN_SPREAD = 0.2  # ... to at least this share either side of the expected value
SAME_BYTES = 0.1  # storage bytes within this share of the checkpoint read "the same"
LOAD_READ = semconv.STAGE_LOAD_READ
COMPILE = semconv.STAGE_WARMUP_COMPILE


@dataclass(frozen=True)
class Conditions:
    """What the caller read now, ``None`` where it could not tell."""

    checkpoint_bytes: int | None = None  # the checkpoint's shards on disk, in all
    resident_ratio: float | None = None  # their share in the page cache now (mincore)
    compile_cache_ready: bool | None = None  # the compile cache holds this model's artifacts
    sleeping: bool | None = None  # a sleeping server holds this model (a wake-up, not a start)
    device_held_by: tuple[str, ...] = ()  # other processes holding the device memory
    outgoing: str | None = None  # the model whose server must leave first (None: none)
    outgoing_evictions_s: tuple[float, ...] = ()  # that server's earlier evictions, s
    notes: tuple[str, ...] = ()  # what a reader could not read, in words


@dataclass(frozen=True)
class StageForecast:
    """Expected seconds in one stage, and the range the earlier activations give."""

    stage: str
    expected_s: float
    low_s: float
    high_s: float


@dataclass
class Forecast:
    """One model's forecast. ``total_s`` is ``None`` with ``status == NO_HISTORY``."""

    model: str
    key: str | None
    status: str  # "forecast" | NO_HISTORY
    total_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    stages: dict[str, StageForecast] = field(default_factory=dict)  # families, TTFT order
    substages: dict[str, StageForecast] = field(default_factory=dict)
    basis_count: int = 0
    basis: list[str] = field(default_factory=list)  # how the conditions differ, in words
    conditions: Conditions = field(default_factory=Conditions)

    def largest_stage(self) -> str | None:
        return max(self.stages, key=lambda s: self.stages[s].expected_s) if self.stages else None

    def as_dict(self) -> dict[str, Any]:
        def one(f: StageForecast) -> dict[str, float]:
            return {"expected_s": round(f.expected_s, 6), "low_s": round(f.low_s, 6),
                    "high_s": round(f.high_s, 6)}

        c = self.conditions
        return {
            "model": self.model, "key": self.key, "status": self.status,
            "total_s": None if self.total_s is None else round(self.total_s, 6),
            "low_s": None if self.low_s is None else round(self.low_s, 6),
            "high_s": None if self.high_s is None else round(self.high_s, 6),
            "largest_stage": self.largest_stage(),
            "stages": {k: one(v) for k, v in self.stages.items()},
            "substages": {k: one(v) for k, v in self.substages.items()},
            "basis_count": self.basis_count, "basis": list(self.basis),
            "conditions": {"checkpoint_bytes": c.checkpoint_bytes,
                           "resident_ratio": c.resident_ratio,
                           "compile_cache_ready": c.compile_cache_ready, "sleeping": c.sleeping,
                           "device_held_by": list(c.device_held_by), "outgoing": c.outgoing,
                           "notes": list(c.notes)},
        }


def no_history(model: str, conditions: Conditions | None = None) -> Forecast:
    return Forecast(model=model, key=None, status=NO_HISTORY,
                    basis=["never started on this host"], conditions=conditions or Conditions())


# --- the records -----------------------------------------------------------------------------
def is_start(record: dict) -> bool:
    return record.get("kind", "start") == "start"


def record_model(record: dict) -> str | None:
    """The served name, else the checkpoint the record's configuration names."""
    model = record.get("model") or (record.get("config") or {}).get("model_config.model")
    return model if isinstance(model, str) and model else None


def group_starts(records: Iterable[dict]) -> dict[str, list[dict]]:
    """Start records by key (model and configuration), oldest first; the latest key of a model
    last, so the dict's order is the order each key was last seen."""
    by_key: dict[str, list[dict]] = {}
    for r in sorted((r for r in records if is_start(r)), key=lambda r: _num(r.get("at"))):
        by_key.setdefault(r["key"], []).append(r)
    return dict(sorted(by_key.items(), key=lambda kv: _num(kv[1][-1].get("at"))))


def evictions(records: Iterable[dict], model: str) -> list[float]:
    """Seconds of the recorded evictions (kind ``switch``) of ``model``'s servers."""
    return [float(r["duration_s"]) for r in records
            if r.get("kind") == "switch" and record_model(r) == model]


HANDOVER_MAX_S = 120.0  # a start this long after an eviction ended was not waiting for it


def handovers(records: Iterable[dict]) -> list[float]:
    """Seconds between an eviction's end and the next start's exec on this host, where a start
    followed one within ``HANDOVER_MAX_S``: the swapper's own part of a switch (the outgoing
    process's exit after its last span, the next process's spawn), which neither server sees."""
    ends = sorted(_num(r.get("ended_at")) for r in records
                  if r.get("kind") == "switch" and _num(r.get("ended_at")) > 0)
    out = []
    for r in records:
        began = _num(r.get("started_at"))
        if not is_start(r) or began <= 0:
            continue
        before = [e for e in ends if e <= began]
        if before and began - before[-1] <= HANDOVER_MAX_S:
            out.append(began - before[-1])
    return out


def first_token_stages(record: dict) -> tuple[dict[str, float], bool]:
    """Seconds per (sub-)stage of one activation's first token: its start -> ready, then its
    first request (``cold.first``; else the cold requests' mean). The flag: a first request was
    recorded."""
    out = {k: float(v) for k, v in record["stages"].items()}
    cold = record.get("cold") or {}
    first = cold.get("first") if isinstance(cold.get("first"), dict) else None
    if first is not None and isinstance(first.get("stages"), dict):
        parts, scale = first["stages"], 1.0
    elif isinstance(cold.get("stages"), dict):
        parts, scale = cold["stages"], 1.0 / max(_num(cold.get("requests")) or 1.0, 1.0)
    else:
        return out, False
    for k, v in parts.items():
        if isinstance(v, (int, float)) and k != semconv.STAGE_FIRST_DECODE:
            out[k] = out.get(k, 0.0) + float(v) * scale
    return out, True


def storage_bytes(record: dict) -> float | None:
    ev = record.get("evidence") or {}
    value = ev.get("bytes_read")
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def checkpoint_bytes(record: dict) -> float | None:
    """The checkpoint's size as that start saw it: recorded, else from the bytes read and the
    share that was resident."""
    ev = record.get("evidence") or {}
    if isinstance(ev.get("shard_bytes"), (int, float)) and ev["shard_bytes"] > 0:
        return float(ev["shard_bytes"])
    read, ratio = storage_bytes(record), ev.get("page_cache_resident_ratio")
    if read is not None and isinstance(ratio, (int, float)) and ratio < 0.99:
        return read / (1.0 - ratio)
    return None


def _read_seconds(record: dict) -> float:
    stages = record["stages"]
    return float(stages.get(LOAD_READ, stages.get(semconv.STAGE_LOAD, 0.0)))


def storage_cost(records: Iterable[dict]) -> tuple[float | None, str]:
    """This host's storage cost, s per byte read from storage, and how it was measured."""
    groups = group_starts(records)
    slopes = []
    for starts in groups.values():
        points = [(b, _read_seconds(r)) for r in starts
                  if (b := storage_bytes(r)) is not None]
        size = max((checkpoint_bytes(r) or 0.0 for r in starts), default=0.0)
        xs = [x for x, _ in points]
        if len(points) >= 2 and size > 0 and max(xs) - min(xs) >= 0.5 * size:
            slope = _slope(points)
            if slope is not None and slope > 0:
                slopes.append(slope)
    if slopes:
        return statistics.median(slopes), (f"storage cost from {len(slopes)} model(s) read both "
                                           "cold and warm on this host")
    cold = [_read_seconds(r) / b for starts in groups.values() for r in starts
            if (b := storage_bytes(r)) and (size := checkpoint_bytes(r))
            and b >= 0.5 * size]
    if cold:
        return statistics.median(cold), ("storage cost from cold reads on this host (an upper "
                                         "bound: it counts each read's fixed cost too)")
    return None, "no cold read measured on this host"


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else None


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


# --- the forecast ----------------------------------------------------------------------------
def forecast(model: str, starts: Sequence[dict], conditions: Conditions,
             host_records: Sequence[dict] = ()) -> Forecast:
    """``model``'s forecast from its earlier start records (one key, oldest first) and the
    conditions now; ``host_records`` (every record of the host) give the storage cost."""
    starts = [r for r in starts if is_start(r)][-MAX_BASIS:]
    if not starts:
        return no_history(model, conditions)
    basis: list[str] = []
    if conditions.sleeping:
        basis.append("a sleeping server holds it: a wake-up would bring it back, and wake-ups "
                     "are not recorded yet; this forecasts a start")
    rows = []
    first_seen = 0
    for r in starts:
        stages, has_first = first_token_stages(r)
        first_seen += has_first
        rows.append(stages)
    if first_seen < len(rows):
        basis.append(f"{len(rows) - first_seen} of {len(rows)} activations without a first "
                     "request recorded: their first token counts start -> ready only")
    _adjust_compile(starts, rows, conditions, basis)
    _adjust_load(starts, rows, conditions, host_records or starts, basis)
    switch = _switch(conditions, handovers(host_records or starts), basis)
    keys = sorted({k for row in rows for k in row})
    sub = {k: _stage(k, [row.get(k, 0.0) for row in rows]) for k in keys}
    if switch is not None:
        sub[semconv.STAGE_SWITCH] = switch
    families: dict[str, StageForecast] = {}
    for fam in semconv.TTFT_PIPELINE:
        parts = [f for k, f in sub.items() if semconv.stage_family(k) == fam]
        if parts:
            families[fam] = StageForecast(fam, sum(p.expected_s for p in parts),
                                          sum(p.low_s for p in parts),
                                          sum(p.high_s for p in parts))
    totals = [sum(row.values()) for row in rows]
    sw = switch or StageForecast(semconv.STAGE_SWITCH, 0.0, 0.0, 0.0)
    total = sum(f.expected_s for f in families.values())
    low, high = min(totals) + sw.low_s, max(totals) + sw.high_s
    if len(rows) < THIN:
        low, high = min(low, total * (1 - THIN_SPREAD)), max(high, total * (1 + THIN_SPREAD))
        basis.append(f"thin basis ({len(rows)} activation{'s' if len(rows) > 1 else ''}): "
                     f"range widened to at least ±{THIN_SPREAD:.0%}")
    basis.insert(0, f"{len(rows)} earlier activation{'s' if len(rows) > 1 else ''} on this host")
    return Forecast(model=model, key=starts[-1]["key"], status="forecast", total_s=total,
                    low_s=min(low, total), high_s=max(high, total), stages=families,
                    substages={k: v for k, v in sub.items() if "." in k},
                    basis_count=len(rows), basis=basis, conditions=conditions)


def _stage(stage: str, values: list[float]) -> StageForecast:
    return StageForecast(stage, statistics.median(values), min(values), max(values))


def _switch(conditions: Conditions, gaps: Sequence[float],
            basis: list[str]) -> StageForecast | None:
    """The outgoing server's eviction, plus the handover the host's swapper took after one."""
    if conditions.outgoing is None:
        if conditions.device_held_by:
            basis.append("device memory held by " + ", ".join(conditions.device_held_by)
                         + ": it must be freed first (its eviction is not forecast)")
        return None
    seen = list(conditions.outgoing_evictions_s)[-MAX_BASIS:]
    if not seen:
        basis.append(f"{conditions.outgoing} must leave first; its eviction was never "
                     "measured here (switch not forecast)")
        return None
    evict = _stage(semconv.STAGE_SWITCH, seen)
    line = (f"switch: {conditions.outgoing} leaves first ({len(seen)} eviction"
            f"{'s' if len(seen) > 1 else ''} measured)")
    if gaps:
        gaps = list(gaps)[-MAX_BASIS:]
        hand = _stage(semconv.STAGE_SWITCH, gaps)
        evict = StageForecast(semconv.STAGE_SWITCH, evict.expected_s + hand.expected_s,
                              evict.low_s + hand.low_s, evict.high_s + hand.high_s)
        line += (f", then {hand.expected_s:.2f} s until the next start's exec (median of "
                 f"{len(gaps)} handover{'s' if len(gaps) > 1 else ''} here)")
    basis.append(line)
    return evict


def _adjust_compile(starts: Sequence[dict], rows: list[dict[str, float]],
                    conditions: Conditions, basis: list[str]) -> None:
    """Each start's compile time replaced by what the starts whose cache hit (or missed) as
    the cache would now took."""
    want = conditions.compile_cache_ready
    hits = [(r.get("evidence") or {}).get("compile_cache_hit") for r in starts]
    if want is None or not any(row.get(COMPILE) for row in rows):
        return
    like = [row.get(COMPILE, 0.0) for row, hit in zip(rows, hits, strict=True) if hit is want]
    differ = sum(1 for hit in hits if hit is not None and hit is not want)
    if not differ:
        return
    now = "holds" if want else "lacks"
    if not like:
        basis.append(f"the compile cache now {now} this model's artifacts, as no earlier "
                     f"start saw it: {COMPILE} as they measured it")
        return
    value = statistics.median(like)
    for row, hit in zip(rows, hits, strict=True):
        if hit is not want:
            row[COMPILE] = value
    basis.append(f"the compile cache now {now} this model's artifacts: {COMPILE} from the "
                 f"{len(like)} start(s) that saw it so ({differ} did not)")


def _adjust_load(starts: Sequence[dict], rows: list[dict[str, float]], conditions: Conditions,
                 host_records: Sequence[dict], basis: list[str]) -> None:
    """Each start's shard-read time moved to the bytes that must come from storage now."""
    size = conditions.checkpoint_bytes
    ratio = conditions.resident_ratio
    if size is None or ratio is None:
        basis.append("page cache of the checkpoint not read: load as the earlier starts "
                     "measured it")
        return
    now = size * (1.0 - ratio)
    past = [storage_bytes(r) for r in starts]
    if any(b is None for b in past):
        basis.append("an earlier start recorded no bytes read: load as they measured it")
        return
    target = LOAD_READ if any(LOAD_READ in row for row in rows) else semconv.STAGE_LOAD
    same = all(abs(b - now) <= SAME_BYTES * max(size, 1) for b in past)
    if same:
        basis.append(f"checkpoint {ratio:.0%} in the page cache, as the earlier starts read "
                     "it")
        return
    points = list(zip(past, (row.get(target, 0.0) for row in rows), strict=True))
    spread = max(past) - min(past)
    slope = _slope(points) if spread >= 0.5 * max(size, 1) else None
    how = "a line through this model's cold and warm starts"
    if slope is None or slope <= 0:
        slope, how = storage_cost(host_records)
    if slope is None:
        basis.append(f"checkpoint {ratio:.0%} in the page cache now, unlike the earlier "
                     f"starts; {how}: load as they measured it")
        return
    for row, b in zip(rows, past, strict=True):
        row[target] = max(row.get(target, 0.0) + (now - b) * slope, 0.0)
    basis.append(f"checkpoint {ratio:.0%} in the page cache now ({_mb(now)} from storage, "
                 f"earlier starts {_mb(statistics.median(past))}): {target} moved by "
                 f"{how}")


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"
