"""Reading a store without writing to it: what analysis, ``tree`` and ``export`` use.

Streams rows through read-only connections, so a reader never blocks the sink (WAL) and memory
stays bounded by what the caller keeps; ``read_traces`` walks the trace-id index.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from itertools import groupby
from operator import itemgetter
from pathlib import Path

import msgspec

from otel_ttft.tools import safe_io
from otel_ttft.tools.sink.db import DB_FILE, METRICS_FILE, StoreFormatError, connect


class _Resources:
    """resource id -> dict, each decoded once per read and shared by the spans that reference
    it (treat it as read-only)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self._path, self._conn, self.cache = path, conn, {}

    def get(self, rid: int | None) -> dict:
        cached = self.cache.get(rid)
        if cached is None:
            row = self._conn.execute("SELECT data FROM resources WHERE id = ?", (rid,)).fetchone()
            cached = _json_object(self._path, f"resource {rid}", row[0]) if row else {}
            self.cache[rid] = cached
        return cached


def _json_object(path: Path, where: str, data: object) -> dict:
    """A stored JSON object column; StoreFormatError naming the row when it is not one."""
    try:
        value = _decode(data)
    except (msgspec.DecodeError, TypeError) as exc:
        raise StoreFormatError(path, None, f"{where}: data is not JSON ({exc})") from None
    if type(value) is not dict:
        raise StoreFormatError(path, None, f"{where}: data is not a JSON object")
    return value


_SPAN_SELECT = ("SELECT id, trace_id, span_id, parent_span_id, name, start_ns, end_ns, "
                "resource_id, data FROM spans")
# msgspec (a vLLM dependency) decodes the stored JSON about four times faster than json: this
# runs once per span read, a million times for a large store.
_decode = msgspec.json.Decoder().decode
_INT64_MAX = (1 << 63) - 1
# What a span's data may hold, by type; the columns' names may not appear there (they would
# replace the columns' values).
_REST_TYPES = {"attributes": dict, "events": list, "links": list, "status": dict, "kind": str,
               "scope": str}
_COLUMNS = frozenset({"trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns",
                      "resource"})
_COMMON = frozenset({"attributes", "scope"})  # what most spans' data holds
_EMPTY: dict = {}


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


_TYPE_NAMES = {str: "text", int: "an integer", float: "a float", bytes: "a BLOB",
               type(None): "NULL", list: "a list", dict: "an object", bool: "a boolean"}


def _row_problem(tid: object, sid: object, parent: object, name: object, start: object,
                 end: object) -> str:
    """What is wrong with a span row's columns (the slow path, once per damaged store)."""
    for column, value in (("trace_id", tid), ("span_id", sid), ("name", name)):
        if type(value) is not str:
            return f"{column} is {_type_name(value)}, not text"
    if parent is not None and type(parent) is not str:
        return f"parent_span_id is {_type_name(parent)}, not text"
    for column, value in (("start_ns", start), ("end_ns", end)):
        if type(value) is not int:
            return f"{column} is {_type_name(value)}, not a time in ns"
        if not 0 <= value <= _INT64_MAX:
            return f"{column} {value} is out of range for a time in ns"
    return "unreadable"


def _rest_problem(rest: dict) -> str | None:
    for key, value in rest.items():
        expected = _REST_TYPES.get(key)
        if expected is not None:
            if type(value) is not expected:
                return f"{key!r} is {_type_name(value)}, not {_TYPE_NAMES[expected]}"
        elif key in _COLUMNS:
            return f"data holds {key!r}, which is a column"
    return None


def _spans(path: Path, where: str, params: tuple, order: str) -> Iterator[dict]:
    """Every selected span as a normalized dict. One loop with the row-to-dict step inline:
    this is the innermost loop of ``tree`` and ``analyze``. Every column and the data's fields
    are type-checked on the way (a store written by another program, or damaged, gives one
    StoreFormatError naming the row, never a span analysis or export cannot use)."""
    conn = None
    try:
        conn = connect(path, readonly=True)
        resources = _Resources(path, conn)
        cache, get_resource, decode = resources.cache, resources.get, _decode
        rest_types, columns, common, empty = _REST_TYPES, _COLUMNS, _COMMON, _EMPTY
        for rowid, tid, sid, parent, name, start, end, rid, data in conn.execute(
                f"{_SPAN_SELECT} {where} ORDER BY {order}", params):
            if (type(tid) is not str or type(sid) is not str or type(name) is not str
                    or type(start) is not int or type(end) is not int or start < 0 or end < 0
                    or (parent is not None and type(parent) is not str)):
                raise StoreFormatError(path, None, f"span row {rowid}: "
                                       + _row_problem(tid, sid, parent, name, start, end))
            resource = cache.get(rid)
            span = {"trace_id": tid, "span_id": sid, "parent_span_id": parent, "name": name,
                    "kind": "INTERNAL", "start_ns": start, "end_ns": end, "attributes": {},
                    "resource": resource if resource is not None else get_resource(rid),
                    "events": [], "links": [], "status": {"code": "UNSET", "message": ""}}
            try:
                rest = decode(data)
            except (msgspec.DecodeError, TypeError) as exc:
                raise StoreFormatError(path, None, f"span row {rowid} ({sid!r}): data is not "
                                       f"JSON ({exc})") from None
            if type(rest) is not dict:
                raise StoreFormatError(path, None, f"span row {rowid} ({sid!r}): data is not "
                                       "a JSON object")
            if rest.keys() <= common:  # most rows: attributes and scope only
                if (type(rest.get("attributes", empty)) is not dict
                        or type(rest.get("scope", "")) is not str):
                    raise StoreFormatError(path, None, f"span row {rowid} ({sid!r}): "
                                           f"{_rest_problem(rest)}")
            else:
                for key in rest:
                    expected = rest_types.get(key)
                    if ((type(rest[key]) is not expected) if expected is not None
                            else key in columns):
                        raise StoreFormatError(path, None, f"span row {rowid} ({sid!r}): "
                                               f"{_rest_problem(rest)}")
            span.update(rest)
            yield span
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(path, None, f"not a readable store ({exc})") from None
    except RecursionError:
        raise StoreFormatError(path, None, "stored JSON nested too deeply") from None
    finally:
        if conn is not None:
            conn.close()


def read_spans(path: Path, *, where: str = "", params: tuple = (),
               order: str = "id") -> Iterator[dict]:
    """Stream spans from a store database (arrival order unless told). Row by row: a span is
    garbage as soon as the caller drops it, which keeps the cyclic GC's work small."""
    return _spans(path, where, params, order)


def read_traces(path: Path, trace_id: str | None = None) -> Iterator[list[dict]]:
    """One trace's spans per item, in trace-id order, streamed through the trace-id index;
    ``trace_id``: only that one."""
    where, params = ("WHERE trace_id = ?", (trace_id,)) if trace_id else ("", ())
    for _, spans in groupby(_spans(path, where, params, "trace_id, id"), _TRACE_ID):
        yield list(spans)


_TRACE_ID = itemgetter("trace_id")


def read_metric_points(path: Path) -> Iterator[dict]:
    """Every metric point in arrival order; StoreFormatError naming the row for one that is
    not a point (the Prometheus exposition reads every field checked here)."""
    conn = None
    try:
        conn = connect(path, readonly=True)
        resources = _Resources(path, conn)
        for rowid, rid, data in conn.execute(
                "SELECT id, resource_id, data FROM metric_points ORDER BY id"):
            point = _json_object(path, f"metric point row {rowid}", data)
            problem = point_problem(point)
            if problem:
                raise StoreFormatError(path, None, f"metric point row {rowid}: {problem}")
            point["resource"] = resources.get(rid)
            yield point
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(path, None, f"not a readable store ({exc})") from None
    except RecursionError:
        raise StoreFormatError(path, None, "stored JSON nested too deeply") from None
    finally:
        if conn is not None:
            conn.close()


_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})  # how the receiver stores them


def _is_number(value: object, *, optional: bool = True) -> bool:
    if value is None:
        return optional
    return (type(value) in (int, float)) or value in _NON_FINITE


def _numbers(value: object) -> bool:
    return type(value) is list and all(_is_number(v, optional=False) for v in value)


def point_problem(point: dict) -> str | None:
    """Why a stored metric point cannot be exposed, or None (the shape ``otlp_decode`` writes)."""
    if type(point.get("name")) is not str:
        return "no text 'name'"
    for key, typ in (("attributes", dict), ("unit", str), ("type", str), ("scope", str),
                     ("temporality", str), ("description", str), ("exemplars", list)):
        if point.get(key) is not None and type(point[key]) is not typ:
            return f"{key!r} is {_type_name(point[key])}, not {_TYPE_NAMES[typ]}"
    for key in ("time_ns", "start_time_ns", "count", "zero_count"):
        value = point.get(key)
        if value is not None and (type(value) is not int or not 0 <= value <= _INT64_MAX):
            return f"{key!r} is not a count or time in ns"
    for key in ("value", "sum", "min", "max"):
        if not _is_number(point.get(key)):
            return f"{key!r} is {_type_name(point[key])}, not a number"
    for key in ("explicit_bounds", "bucket_counts"):
        if point.get(key) is not None and not _numbers(point[key]):
            return f"{key!r} is not a list of numbers"
    if any(type(c) is not int for c in point.get("bucket_counts") or []):
        return "'bucket_counts' is not a list of integers"
    if point.get("type") == "histogram" and not (
            type(point.get("bucket_counts")) is list and type(point.get("explicit_bounds"))
            is list):
        return "a histogram without 'bucket_counts' and 'explicit_bounds'"
    quantiles = point.get("quantiles")
    if quantiles is not None and (type(quantiles) is not list or not all(
            type(q) is dict and _is_number(q.get("quantile"), optional=False)
            and _is_number(q.get("value"), optional=False) for q in quantiles)):
        return "'quantiles' is not a list of {quantile, value}"
    for ex in point.get("exemplars") or []:
        if type(ex) is not dict or not _is_number(ex.get("value")) or not all(
                ex.get(k) is None or type(ex[k]) is str for k in ("trace_id", "span_id")):
            return "'exemplars' holds something that is not an exemplar"
    return None


def read_store_metric_points(directory: Path) -> Iterator[dict]:
    """A store directory's metric points without creating anything there: earlier versions'
    ``metrics.jsonl`` first, then the database (nothing while neither exists yet)."""
    legacy = directory / METRICS_FILE
    for lineno, point in iter_jsonl(legacy):
        problem = point_problem(point)
        if problem:
            raise StoreFormatError(legacy, lineno, problem)
        yield point
    if os.path.lexists(directory / DB_FILE):
        yield from read_metric_points(directory / DB_FILE)


class StoreReader:
    """A store directory read without writing to it (no schema, no directory created): what
    ``prometheus`` serves from, while the sink may still be about to create the store."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def exists(self) -> bool:
        return any(os.path.lexists(self.directory / name) for name in (DB_FILE, METRICS_FILE))

    def metric_points(self) -> list[dict]:
        return list(read_store_metric_points(self.directory))

    def __repr__(self) -> str:
        return f"StoreReader({str(self.directory)!r})"


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Earlier versions' JSON lines: ``(line number, object)``; a last line without a newline
    that does not parse is the remainder of an interrupted write and is skipped."""
    if not os.path.lexists(path):
        return
    try:
        f = safe_io.open_regular(path)  # a FIFO or device is refused, never blocks
    except safe_io.InputError as exc:
        raise StoreFormatError(path, None, exc.reason) from None
    with f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            is_tail = not raw.endswith(b"\n")
            try:
                obj = json.loads(raw)
            except RecursionError:
                raise StoreFormatError(path, lineno, "JSON nested too deeply") from None
            except ValueError as exc:
                if is_tail:
                    return
                raise StoreFormatError(path, lineno, f"not JSON ({exc})") from None
            if not isinstance(obj, dict):
                if is_tail:
                    return
                raise StoreFormatError(path, lineno, "not a JSON object")
            yield lineno, obj
