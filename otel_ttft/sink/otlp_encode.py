"""Normalized spans -> OTLP/JSON export requests, the inverse of ``otlp_decode``.

So a store can be handed to anything that reads the Collector's file-exporter format (one
``{"resourceSpans": [...]}`` per line, hex ids, integer enums, 64-bit integers as strings), and
read back by ``load_spans`` unchanged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

SPANS_PER_LINE = 1000


def any_value(value: Any) -> dict:
    """A decoded attribute value back to an OTLP/JSON AnyValue (hex bytes stay strings)."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": key_values(value)}}
    return {"stringValue": str(value)}


def key_values(attributes: dict | None) -> list[dict]:
    return [{"key": str(k), "value": any_value(v)} for k, v in (attributes or {}).items()]


def _enum(enum: Any, name: Any, prefix: str) -> int:
    try:
        return enum.Value(prefix + str(name))
    except ValueError:
        return int(name) if str(name).isdigit() else 0


def span_json(span: dict) -> dict:
    status = span.get("status") or {}
    out = {
        "traceId": span["trace_id"], "spanId": span["span_id"],
        "name": span["name"],
        "kind": _enum(trace_pb2.Span.SpanKind, span.get("kind", "INTERNAL"), "SPAN_KIND_"),
        "startTimeUnixNano": str(span["start_ns"]), "endTimeUnixNano": str(span["end_ns"]),
        "attributes": key_values(span.get("attributes")),
        "events": [{"name": e.get("name", ""), "timeUnixNano": str(e.get("time_ns", 0)),
                    "attributes": key_values(e.get("attributes"))}
                   for e in span.get("events") or []],
        "links": [{"traceId": lk["trace_id"], "spanId": lk["span_id"],
                   "attributes": key_values(lk.get("attributes"))}
                  for lk in span.get("links") or []],
        "status": {"code": _enum(trace_pb2.Status.StatusCode, status.get("code", "UNSET"),
                                 "STATUS_CODE_"),
                   "message": status.get("message", "")},
    }
    if span.get("parent_span_id"):
        out["parentSpanId"] = span["parent_span_id"]
    return out


def trace_request_json(spans: Iterable[dict]) -> dict:
    """One export request: spans grouped by resource, then by instrumentation scope."""
    groups: dict[str, dict[str, list[dict]]] = {}
    resources: dict[str, dict] = {}
    for span in spans:
        resource = span.get("resource") or {}
        key = json.dumps(resource, sort_keys=True, default=str)
        resources[key] = resource
        groups.setdefault(key, {}).setdefault(str(span.get("scope") or ""), []).append(
            span_json(span))
    return {"resourceSpans": [
        {"resource": {"attributes": key_values(resources[key])},
         "scopeSpans": [{"scope": {"name": scope}, "spans": members}
                        for scope, members in scopes.items()]}
        for key, scopes in groups.items()]}


def _chunks(traces: Iterable[list[dict]]) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for trace in traces:
        chunk.extend(trace)
        if len(chunk) >= SPANS_PER_LINE:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def export_json(source: str | Path, output: str | Path) -> int:
    """Write every span of ``source`` (anything ``load_spans`` reads) to ``output`` as OTLP/JSON
    lines, a trace never split across lines; returns the span count. Streams over a store."""
    from otel_ttft.analysis.traces import iter_traces

    count = 0
    out = sys.stdout if str(output) == "-" else open(output, "w", encoding="utf-8")  # noqa: SIM115
    try:
        for chunk in _chunks(iter_traces(source)):
            out.write(json.dumps(trace_request_json(chunk), separators=(",", ":")) + "\n")
            count += len(chunk)
    finally:
        if out is not sys.stdout:
            out.close()
    return count
