"""The stage spans of an activation, gathered across the processes of one server for its live
verdict (``activation_verdict``).

An activation's stages end in three processes (API server, EngineCore, worker); its verdict is
taken in the API server. Each process keeps the stage spans it ended (interval and stage, plus the
facts a fix is sized by) per activation trace, and a writer thread leaves them in a small file in
the state directory (``/dev/shm``), coalesced, off the span's path. The API server reads the
files of its trace when it is ready, and removes them once the activation has been judged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from otel_ttft import semconv
from otel_ttft.diagnosis.ranks import RankedInterval
from otel_ttft.diagnosis.record import FACT_ATTRIBUTES, Interval
from otel_ttft.runtime import activation_history, state_files

MAX_SHARD_PATHS = 64  # checkpoint files named per activation (a fix's command lists them)
MAX_SPANS = 512  # per activation and process: shard reads of a large checkpoint, merged
MAX_TRACES = 4  # activations kept per process (a start, a few wake-ups)
WRITE_EVERY_S = 0.05  # coalescing of the writer thread
IDLE_S = 0.5  # the writer thread ends after this long with nothing to write
STALE_S = 24 * 3600
_FAMILIES = (semconv.STAGE_SWITCH, semconv.STAGE_LOAD, semconv.STAGE_WARMUP)
_FACT_KEYS = {v: k for k, v in FACT_ATTRIBUTES.items()}


def _path(trace_hex: str, pid: int) -> Path:
    return state_files.state_dir() / f"otel-ttft-ledger-{trace_hex}-{pid}.json"


class _Entry:
    """One activation's stage spans in this process."""

    def __init__(self) -> None:
        self.spans: list[list] = []  # [start_ns, end_ns, stage(, worker rank(, 1: a wait))]
        self.shard_bytes = 0
        self.resident_weighted = 0.0
        self.resident_weight = 0
        self.compile_hits: list[bool] = []
        self.facts: dict[str, Any] = {}
        self.shard_paths: list[str] = []  # the checkpoint files read (page-cache warming)

    def as_json(self) -> dict:
        return {"spans": self.spans, "shard_bytes": self.shard_bytes,
                "shard_paths": self.shard_paths,
                "resident_weighted": self.resident_weighted,
                "resident_weight": self.resident_weight, "compile_hits": self.compile_hits,
                "facts": self.facts}


class StageLedger(SpanProcessor):
    """Keeps the activation stage spans this process ends; exports nothing. Our configurator
    puts it on the provider it builds (``install``); a provider we did not build has none, and
    its activations are not judged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        stage = attrs.get(semconv.ATTR_STAGE) or semconv.VLLM_SPAN_STAGES.get(span.name)
        if (not isinstance(stage, str) or semconv.stage_family(stage) not in _FAMILIES
                or span.start_time is None or span.end_time is None
                or attrs.get(semconv.ATTR_SPAN_UNFINISHED)):
            return
        key = format(span.context.trace_id, "032x")
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if len(self._entries) >= MAX_TRACES:
                    self._entries.pop(next(iter(self._entries)))
                entry = self._entries[key] = _Entry()
            _add(entry, span.start_time, span.end_time, stage, attrs)
            self._dirty.add(key)
            self._start_writer()
        self._wake.set()

    def shutdown(self) -> None:
        self._write()

    def entry(self, trace_hex: str) -> dict | None:
        with self._lock:
            entry = self._entries.get(trace_hex)
            return entry.as_json() if entry is not None else None

    def _start_writer(self) -> None:
        """Under ``_lock``: a writer is running, or one starts."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._loop, name="otel-ttft-ledger",
                                            daemon=True)
            self._writer.start()

    def _loop(self) -> None:
        """Writes while there is something to write; ends once idle (no thread lingers after an
        activation, or after uninstrument), and ``on_end`` starts another when needed."""
        while True:
            if not self._wake.wait(IDLE_S):
                with self._lock:
                    if not self._dirty:
                        self._writer = None
                        return
            self._wake.clear()
            self._write()
            time.sleep(WRITE_EVERY_S)

    def _write(self) -> None:
        with self._lock:
            dirty = {k: self._entries[k].as_json() for k in self._dirty if k in self._entries}
            self._dirty.clear()
        for key, data in dirty.items():
            with contextlib.suppress(OSError, TypeError, ValueError):
                state_files.write_atomic(_path(key, os.getpid()), data)


def _add(entry: _Entry, start: int, end: int, stage: str, attrs: Any) -> None:
    rank = attrs.get(semconv.ATTR_PARALLEL_RANK)
    item = [start, end, stage] if not isinstance(rank, int) else [start, end, stage, rank]
    if attrs.get(semconv.ATTR_PARALLEL_WAIT) is True and len(item) == 4:
        item.append(1)  # this rank waiting for the others (``diagnosis.ranks``)
    last = entry.spans[-1] if entry.spans else None
    if last is not None and last[2:] == item[2:] and 0 <= start - last[1] < 1_000_000:
        last[1] = max(last[1], end)  # consecutive shard reads: one interval
    elif len(entry.spans) < MAX_SPANS:
        entry.spans.append(item)
    if stage == semconv.STAGE_LOAD_READ:
        size = attrs.get(semconv.ATTR_SHARD_BYTES)
        size = size if isinstance(size, int) and size > 0 else 0
        entry.shard_bytes += size
        path = attrs.get(semconv.ATTR_SHARD_PATH)
        if isinstance(path, str) and path and len(entry.shard_paths) < MAX_SHARD_PATHS \
                and path not in entry.shard_paths:
            entry.shard_paths.append(path[:4096])
        ratio = attrs.get(semconv.ATTR_PAGE_CACHE_RESIDENT)
        if isinstance(ratio, (int, float)) and 0 <= ratio <= 1:
            entry.resident_weighted += float(ratio) * max(size, 1)
            entry.resident_weight += max(size, 1)
    hit = attrs.get(semconv.ATTR_COMPILE_CACHE_HIT)
    if isinstance(hit, bool):
        entry.compile_hits.append(hit)
    for attr in _FACT_KEYS.keys() & set(attrs):
        value, name = attrs[attr], _FACT_KEYS[attr]
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            entry.facts[name] = max(entry.facts.get(name, value), value)
        elif isinstance(value, str) and value:
            entry.facts.setdefault(name, value)
        elif isinstance(value, (list, tuple)):
            entry.facts[name] = sorted({*entry.facts.get(name, ()),
                                        *(v for v in value if isinstance(v, (int, float)))})


_ledgers: list[StageLedger] = []
"""This process's ledger, once our configurator made it: a processor of the provider it built,
living as long as that provider (not an instrumentation); ``gather`` reads its entries in memory."""


def install() -> StageLedger | None:
    """This process's ledger, made once, for our configurator to add to the provider it builds;
    ``None`` while the live verdict is off (``OTEL_TTFT_VERDICT``)."""
    if not activation_history.enabled():
        return None
    if not _ledgers:
        _ledgers.append(StageLedger())
    return _ledgers[0]


def gather(trace_hex: str) -> dict:
    """Every process's part of one activation: ``intervals`` (``Interval``), ``shard_bytes``,
    ``resident_ratio``, ``compile_hits``, ``facts``, and ``ranked`` (``RankedInterval``: the
    workers' spans, each with its rank). Files that do not parse are skipped."""
    parts = [ledger.entry(trace_hex) for ledger in list(_ledgers)]
    mine = os.getpid()
    for path in _ledger_files(trace_hex):
        if path.name.endswith(f"-{mine}.json"):
            continue
        parts.append(state_files.read_json(path))
    out: dict[str, Any] = {"intervals": [], "ranked": [], "shard_bytes": 0, "compile_hits": [],
                           "facts": {}, "shard_paths": []}
    weighted = weight = 0.0
    for part in parts:
        if not isinstance(part, dict):
            continue
        for item in part.get("spans") or []:
            if (isinstance(item, list) and len(item) in (3, 4, 5) and isinstance(item[2], str)
                    and all(isinstance(x, int) and not isinstance(x, bool)
                            for x in (*item[:2], *item[3:]))):
                out["intervals"].append(Interval(item[0], item[1], item[2]))
                if len(item) > 3:
                    out["ranked"].append(RankedInterval(item[0], item[1], item[2], item[3],
                                                        wait=item[4:] == [1]))
        out["shard_bytes"] += _number(part.get("shard_bytes"))
        weighted += _number(part.get("resident_weighted"))
        weight += _number(part.get("resident_weight"))
        out["compile_hits"] += [h for h in part.get("compile_hits") or [] if isinstance(h, bool)]
        paths = part.get("shard_paths")
        out["shard_paths"] += [p for p in (paths if isinstance(paths, list) else ())
                               if isinstance(p, str) and p not in out["shard_paths"]]
        del out["shard_paths"][MAX_SHARD_PATHS:]
        facts = part.get("facts")
        for name, value in (facts.items() if isinstance(facts, dict) else ()):
            if name in FACT_ATTRIBUTES and name not in out["facts"]:
                out["facts"][name] = value
    out["resident_ratio"] = weighted / weight if weight else None
    return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value >= 0 else 0


def _ledger_files(trace_hex: str) -> list[Path]:
    try:
        return sorted(state_files.state_dir().glob(f"otel-ttft-ledger-{trace_hex}-*.json"))
    except OSError:
        return []


def forget(trace_hex: str) -> None:
    """The activation is judged: remove its files, and any ledger file older than a day."""
    for path in _ledger_files(trace_hex):
        with contextlib.suppress(OSError):
            path.unlink()
    now = time.time()
    with contextlib.suppress(OSError):
        for path in state_files.state_dir().glob("otel-ttft-ledger-*.json"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > STALE_S:
                    path.unlink()
