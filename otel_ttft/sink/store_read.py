"""Reading a store without writing to it: what analysis, ``tree`` and ``export`` use.

Streams rows through read-only connections, so a reader never blocks the sink (WAL) and memory
stays bounded by what the caller keeps; ``read_traces`` walks the trace-id index.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from otel_ttft.sink.store import StoreFormatError, connect


class _Resources:
    """resource id -> dict, each decoded once per read and shared by the spans that reference
    it (treat it as read-only)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn, self._cache = conn, {}

    def get(self, rid: int | None) -> dict:
        cached = self._cache.get(rid)
        if cached is None:
            row = self._conn.execute("SELECT data FROM resources WHERE id = ?", (rid,)).fetchone()
            cached = json.loads(row[0]) if row else {}
            self._cache[rid] = cached
        return cached


_SPAN_SELECT = ("SELECT trace_id, span_id, parent_span_id, name, start_ns, end_ns, "
                "resource_id, data FROM spans")


_decode = json.JSONDecoder().raw_decode  # stored JSON starts at offset 0: skip loads' checks


def _span_from_row(row: tuple, resources: _Resources) -> dict:
    span = {"trace_id": row[0], "span_id": row[1], "parent_span_id": row[2], "name": row[3],
            "kind": "INTERNAL", "start_ns": row[4], "end_ns": row[5], "attributes": {},
            "resource": resources.get(row[6]), "events": [], "links": [],
            "status": {"code": "UNSET", "message": ""}}
    span.update(_decode(row[7])[0])
    return span


def read_spans(path: Path, *, where: str = "", params: tuple = (),
               order: str = "id") -> Iterator[dict]:
    """Stream spans from a store database (arrival order unless told). Row by row: a span is
    garbage as soon as the caller drops it, which keeps the cyclic GC's work small."""
    conn = None
    try:
        conn = connect(path, readonly=True)
        resources = _Resources(conn)
        for row in conn.execute(f"{_SPAN_SELECT} {where} ORDER BY {order}", params):
            yield _span_from_row(row, resources)
    except sqlite3.DatabaseError as exc:
        raise StoreFormatError(path, None, f"not a readable store ({exc})") from None
    finally:
        if conn is not None:
            conn.close()


def read_traces(path: Path, trace_id: str | None = None) -> Iterator[list[dict]]:
    """One trace's spans per item, in trace-id order, streamed through the trace-id index;
    ``trace_id``: only that one."""
    current: list[dict] = []
    current_id = None
    where, params = ("WHERE trace_id = ?", (trace_id,)) if trace_id else ("", ())
    for span in read_spans(path, where=where, params=params, order="trace_id, id"):
        if span["trace_id"] != current_id:
            if current:
                yield current
            current, current_id = [], span["trace_id"]
        current.append(span)
    if current:
        yield current


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
