"""Reading a store without writing to it: what analysis, ``tree`` and ``export`` use.

Streams rows through read-only connections, so a reader never blocks the sink (WAL) and memory
stays bounded by what the caller keeps; ``read_traces`` walks the trace-id index.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from itertools import groupby
from operator import itemgetter
from pathlib import Path

import msgspec

from otel_ttft.sink.store import StoreFormatError, connect


class _Resources:
    """resource id -> dict, each decoded once per read and shared by the spans that reference
    it (treat it as read-only)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn, self.cache = conn, {}

    def get(self, rid: int | None) -> dict:
        cached = self.cache.get(rid)
        if cached is None:
            row = self._conn.execute("SELECT data FROM resources WHERE id = ?", (rid,)).fetchone()
            cached = json.loads(row[0]) if row else {}
            self.cache[rid] = cached
        return cached


_SPAN_SELECT = ("SELECT trace_id, span_id, parent_span_id, name, start_ns, end_ns, "
                "resource_id, data FROM spans")
# msgspec (a vLLM dependency) decodes the stored JSON about four times faster than json: this
# runs once per span read, a million times for a large store.
_decode = msgspec.json.Decoder().decode


def _spans(path: Path, where: str, params: tuple, order: str) -> Iterator[dict]:
    """Every selected span as a normalized dict. One loop with the row-to-dict step inline:
    this is the innermost loop of ``tree`` and ``analyze``."""
    conn = None
    try:
        conn = connect(path, readonly=True)
        resources = _Resources(conn)
        cache, get_resource, decode = resources.cache, resources.get, _decode
        for tid, sid, parent, name, start, end, rid, data in conn.execute(
                f"{_SPAN_SELECT} {where} ORDER BY {order}", params):
            resource = cache.get(rid)
            span = {"trace_id": tid, "span_id": sid, "parent_span_id": parent, "name": name,
                    "kind": "INTERNAL", "start_ns": start, "end_ns": end, "attributes": {},
                    "resource": resource if resource is not None else get_resource(rid),
                    "events": [], "links": [], "status": {"code": "UNSET", "message": ""}}
            try:
                rest = decode(data)
            except msgspec.DecodeError as exc:
                raise StoreFormatError(path, None, f"span {sid!r}: data is not JSON ({exc})"
                                       ) from None
            if type(rest) is not dict:
                raise StoreFormatError(path, None, f"span {sid!r}: data is not a JSON object")
            span.update(rest)
            yield span
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(path, None, f"not a readable store ({exc})") from None
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
    conn = None
    try:
        conn = connect(path, readonly=True)
        resources = _Resources(conn)
        for rid, data in conn.execute("SELECT resource_id, data FROM metric_points ORDER BY id"):
            point = json.loads(data)
            point["resource"] = resources.get(rid)
            yield point
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(path, None, f"not a readable store ({exc})") from None
    finally:
        if conn is not None:
            conn.close()


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Earlier versions' JSON lines: ``(line number, object)``; a last line without a newline
    that does not parse is the remainder of an interrupted write and is skipped."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; a generator cannot use `with` early
    except FileNotFoundError:
        return
    with f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            is_tail = not raw.endswith(b"\n")
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                if is_tail:
                    return
                raise StoreFormatError(path, lineno, f"not JSON ({exc})") from None
            if not isinstance(obj, dict):
                if is_tail:
                    return
                raise StoreFormatError(path, lineno, "not a JSON object")
            yield lineno, obj
