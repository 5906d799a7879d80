"""The local telemetry store: one SQLite database (``telemetry.db``) per directory.

Why SQLite: a batch is acknowledged only after its transaction commits, so a crash (kill -9)
or a full disk loses nothing acknowledged and never leaves a half-written record; WAL mode lets
``tree``/``analyze`` read while the sink writes; indexes on trace id, name, stage and start time
let analysis stream one trace at a time instead of loading a million spans.

One writer thread owns the write connection and commits whatever batches are waiting in one
transaction (group commit), so 200 concurrent exporters cost a few fsyncs per second, not 200.
Resources, repeated on every span of a process, are stored once and referenced.

Directories written by earlier versions (``spans.jsonl``, ``metrics.jsonl``) are still read,
before the database's rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from otel_ttft import semconv
from otel_ttft.tools.sink.db import (  # noqa: F401 - the store's file names, part of its API
    DB_FILE,
    METRICS_FILE,
    SPANS_FILE,
    SQLITE_MAGIC,
    STORE_FILES,
    StoreFormatError,
    StoreUnavailable,
    connect,
    is_store_db,
)
from otel_ttft.tools.sink.store_read import iter_jsonl, read_spans, read_store_metric_points

_INT64_MAX = (1 << 63) - 1
WRITE_TIMEOUT_S = 60.0
_SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns")
# Values most spans have, left out of the stored JSON and put back on reading: less to parse.
_SPAN_DEFAULTS = {"kind": "INTERNAL", "events": [], "links": [],
                  "status": {"code": "UNSET", "message": ""}}
_MISSING = object()
def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


# allow_nan=False: the receiver normalizes non-finite numbers; anything left is a bug to see.
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_json_default).encode
# The receiver's rows (decoded protobuf: str, int, finite float, bool, list, dict) need none of
# those checks; msgspec (a vLLM dependency) encodes them about ten times faster.
_fast_dumps = msgspec.json.Encoder().encode


def _batch_rows(spans: Iterable[dict]) -> list[tuple]:
    """Rows for a batch; a resource shared by many spans (as decoded) is encoded once."""
    encoded: dict[int, tuple[dict, str]] = {}
    rows = []
    for span in spans:
        resource = span.get("resource") if isinstance(span, dict) else None
        if isinstance(resource, dict):
            cached = encoded.get(id(resource))
            if cached is None or cached[0] is not resource:
                cached = encoded[id(resource)] = (resource, _dumps(resource))
            rows.append(_span_row(span, cached[1]))
        else:
            rows.append(_span_row(span))
    return rows


def _span_row(span: dict, resource_json: str | None = None) -> tuple:
    """Columns for one span; ValueError when it is not a normalized span."""
    if not isinstance(span, dict):
        raise ValueError(f"a span must be a dict, got {type(span).__name__}")
    for key in ("trace_id", "span_id", "name"):
        if not isinstance(span.get(key), str):
            raise ValueError(f"span without a string {key!r}")
    parent = span.get("parent_span_id")
    if parent is not None and not isinstance(parent, str):
        raise ValueError("span with a non-string 'parent_span_id'")
    for key in ("start_ns", "end_ns"):
        value = span.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT64_MAX:
            raise ValueError(f"span {span['span_id']!r}: {key!r} is not a time in ns")
    for key, typ in (("attributes", dict), ("resource", dict), ("events", list),
                     ("links", list)):
        if span.get(key) is not None and not isinstance(span[key], typ):
            raise ValueError(f"span {span['span_id']!r}: {key!r} is not a {typ.__name__}")
    stage = (span.get("attributes") or {}).get(semconv.ATTR_STAGE)
    rest = {k: v for k, v in span.items()
            if k not in _SPAN_COLUMNS and k != "resource" and _SPAN_DEFAULTS.get(k, _MISSING) != v}
    return (span["trace_id"], span["span_id"], parent, span["name"],
            stage if isinstance(stage, str) else None, span["start_ns"], span["end_ns"],
            resource_json or _dumps(span.get("resource") or {}), _dumps(rest))


def _point_row(point: dict) -> tuple:
    if not isinstance(point, dict) or not isinstance(point.get("name"), str):
        raise ValueError("a metric point must be a dict with a string 'name'")
    time_ns = point.get("time_ns")
    if not isinstance(time_ns, int) or isinstance(time_ns, bool) or not 0 <= time_ns <= _INT64_MAX:
        time_ns = None
    rest = {k: v for k, v in point.items() if k != "resource"}
    return point["name"], time_ns, _dumps(point.get("resource") or {}), _dumps(rest)


class _Job:
    __slots__ = ("table", "rows", "done", "error")

    def __init__(self, table: str, rows: list[tuple]) -> None:
        self.table, self.rows = table, rows
        self.done = threading.Event()
        self.error: BaseException | None = None


class SpanStore:
    """Spans and metric data points of one directory; writes from any thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._resource_ids: dict[str, int] = {}
        try:  # create the schema now: readers may come first
            connect(self.db_path).close()
        except sqlite3.DatabaseError as exc:
            raise StoreFormatError(self.db_path, None, f"not a usable store ({exc})") from None

    @property
    def db_path(self) -> Path:
        return self.directory / DB_FILE

    @property
    def spans_path(self) -> Path:
        """What to hand ``load_spans``/``tree`` for this store's spans."""
        return self.db_path

    @property
    def metrics_path(self) -> Path:
        """Metric points live in the same database."""
        return self.db_path

    # --- writing --------------------------------------------------------------------------------
    def add_spans(self, spans: Iterable[dict]) -> int:
        """Store one batch of normalized spans; returns when it is committed (then it survives
        a crash). ValueError for a malformed span (nothing stored), StoreUnavailable when the
        disk refuses."""
        return self._submit("spans", _batch_rows(spans))

    def add_span_rows(self, rows: list[tuple]) -> int:
        """Store spans decoded by ``otlp_decode.decode_trace_rows`` (already checked there, every
        number finite): the receiver's path, encoding each resource once per batch."""
        encoded: dict[int, tuple[dict, str]] = {}
        out = []
        append, encode = out.append, _fast_dumps
        for tid, sid, parent, name, stage, start, end, resource, rest in rows:
            cached = encoded.get(id(resource))
            if cached is None or cached[0] is not resource:
                cached = encoded[id(resource)] = (resource, _dumps(resource))
            append((tid, sid, parent, name, stage, start, end, cached[1],
                    encode(rest).decode()))
        return self._submit("spans", out)

    def add_metric_points(self, points: Iterable[dict]) -> int:
        """Store one batch of normalized metric data points, like ``add_spans``."""
        return self._submit("metric_points", [_point_row(p) for p in points])

    def _submit(self, table: str, rows: list[tuple]) -> int:
        if not rows:
            return 0
        self._ensure_writer()
        job = _Job(table, rows)
        self._queue.put(job)
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        while not job.done.wait(1.0):
            if time.monotonic() > deadline:  # a writer wedged on a dead disk: say so
                raise StoreUnavailable(f"the store did not commit within {WRITE_TIMEOUT_S:g} s")
            self._ensure_writer()  # one that died (could not open the store) is replaced
        if job.error is not None:
            raise job.error
        return len(rows)

    def _ensure_writer(self) -> None:
        with self._start_lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="otel-ttft-store",
                                                daemon=True)
                self._writer.start()

    def close(self) -> None:
        """Stop the writer thread (after what is queued); the store can still be read."""
        with self._start_lock:
            if self._writer is not None and self._writer.is_alive():
                self._queue.put(None)
                self._writer.join(10)
            self._writer = None

    def _write_loop(self) -> None:
        try:
            conn = connect(self.db_path)
        except sqlite3.Error as exc:  # out of descriptors, store removed...: fail what waits
            self._fail_waiting(_unavailable(exc))
            return
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    return
                jobs = [job]
                while len(jobs) < 256:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        self._queue.put(None)
                        break
                    jobs.append(more)
                self._commit_group(conn, jobs)
        finally:
            conn.close()

    def _fail_waiting(self, error: StoreUnavailable) -> None:
        """Answer every queued job with ``error``; the next batch starts a new writer."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.error = error
                job.done.set()

    def _commit_group(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        try:
            self._commit(conn, jobs)
        except sqlite3.Error as exc:
            if len(jobs) == 1:
                jobs[0].error = _unavailable(exc)
            else:  # one at a time, so one job's failure is not every job's
                for job in jobs:
                    try:
                        self._commit(conn, [job])
                    except sqlite3.Error as one:
                        job.error = _unavailable(one)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            for job in jobs:
                job.error = exc
        for job in jobs:
            job.done.set()

    def _commit(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in jobs:
                if job.table == "spans":
                    rid = self._resource_ids_for(conn, {r[7] for r in job.rows})
                    conn.executemany(
                        "INSERT INTO spans (trace_id, span_id, parent_span_id, name, stage, "
                        "start_ns, end_ns, resource_id, data) VALUES (?,?,?,?,?,?,?,?,?)",
                        [(t, s, p, n, st, b, e, rid[r], d)
                         for t, s, p, n, st, b, e, r, d in job.rows])
                else:
                    conn.executemany(
                        "INSERT INTO metric_points (name, time_ns, resource_id, data) "
                        "VALUES (?,?,?,?)",
                        [(r[0], r[1], self._resource_id(conn, r[2]), r[3]) for r in job.rows])
            conn.execute("COMMIT")
        except BaseException:
            self._resource_ids.clear()  # ids handed out in the rolled-back transaction are void
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _resource_ids_for(self, conn: sqlite3.Connection, datas: set[str]) -> dict[str, int]:
        """Resource JSON -> row id for one job's distinct resources (usually one)."""
        return {data: self._resource_id(conn, data) for data in datas}

    def _resource_id(self, conn: sqlite3.Connection, data: str) -> int:
        rid = self._resource_ids.get(data)
        if rid is None:
            conn.execute("INSERT OR IGNORE INTO resources (data) VALUES (?)", (data,))
            rid = conn.execute("SELECT id FROM resources WHERE data = ?", (data,)).fetchone()[0]
            if len(self._resource_ids) > 10_000:
                self._resource_ids.clear()
            self._resource_ids[data] = rid
        return rid

    # --- reading --------------------------------------------------------------------------------
    def spans(self) -> list[dict]:
        """Every span, earlier versions' ``spans.jsonl`` first, then in arrival order."""
        legacy = [obj for _, obj in iter_jsonl(self.directory / SPANS_FILE)]
        return legacy + list(read_spans(self.db_path))

    def metric_points(self) -> list[dict]:
        """Every metric point (earlier versions' ``metrics.jsonl`` first); StoreFormatError
        naming the line or row of one that is not a point."""
        return list(read_store_metric_points(self.directory))

    def __repr__(self) -> str:
        return f"SpanStore({str(self.directory)!r})"


def _unavailable(exc: sqlite3.Error) -> StoreUnavailable:
    return StoreUnavailable(f"cannot commit to the store: {exc}")
