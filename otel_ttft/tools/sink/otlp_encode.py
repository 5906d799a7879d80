"""Normalized spans -> OTLP/JSON export requests, the inverse of ``otlp_decode``.

So a store can be handed to anything that reads the Collector's file-exporter format (one
``{"resourceSpans": [...]}`` per line, hex ids, integer enums, 64-bit integers as strings), and
read back by ``load_spans`` unchanged.

Valid OTLP/JSON or nothing: every id, time, enum and attribute value is checked on the way out
as strictly as ``otlp_decode`` checks it on the way in (hex ids of the right length and not all
zero, times within int64, integers within int64, non-finite doubles in protobuf-JSON's spelling,
the receiver's nesting limit), and a span that fails is an :class:`ExportError` naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from opentelemetry.proto.trace.v1 import trace_pb2

from otel_ttft.tools.sink.otlp_decode import MAX_DEPTH

SPANS_PER_LINE = 1000
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_HEX = re.compile(r"[0-9a-f]*")
# JSON depth (``otlp_decode``'s count: the request object is 1) of the AnyValue objects of...
_DEPTH_RESOURCE = 7  # resourceSpans[].resource.attributes[].value
_DEPTH_SPAN = 10  # ...scopeSpans[].spans[].attributes[].value
_DEPTH_EVENT = 12  # ...spans[].events[].attributes[].value (links alike)
_KINDS = {k.removeprefix("SPAN_KIND_"): v for k, v in trace_pb2.Span.SpanKind.items()}
_CODES = {k.removeprefix("STATUS_CODE_"): v for k, v in trace_pb2.Status.StatusCode.items()}


class ExportError(ValueError):
    """A span that cannot be written as valid OTLP/JSON; the message names it and why."""


class _Invalid(ValueError):
    """What is wrong, without the span's name (added by the caller)."""


def _type_name(value: Any) -> str:
    return {str: "text", int: "an integer", float: "a float", bool: "a boolean",
            type(None): "null", list: "a list", dict: "an object"}.get(type(value),
                                                                       type(value).__name__)


def any_value(value: Any, depth: int = _DEPTH_SPAN) -> dict:
    """A decoded attribute value back to an OTLP/JSON AnyValue (hex bytes stay strings);
    ``depth``: where the AnyValue object sits in the request (the receiver's nesting limit)."""
    kind = type(value)
    deepest = depth if value is None else depth + (2 if kind in (list, tuple, dict) else 1)
    if deepest > MAX_DEPTH:
        raise _Invalid(f"an attribute value nested deeper than the receiver's {MAX_DEPTH} "
                       "JSON levels")
    if value is None:
        return {}
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Invalid(f"integer attribute value {value} is out of int64 range")
        return {"intValue": str(value)}
    if kind is float:
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if value != value else "Infinity" if value > 0
                else "-Infinity"}
    if kind in (list, tuple):
        return {"arrayValue": {"values": [any_value(v, depth + 3) for v in value]}}
    if kind is dict:
        return {"kvlistValue": {"values": key_values(value, depth + 4)}}
    raise _Invalid(f"attribute value of type {kind.__name__}")


def key_values(attributes: Any, depth: int = _DEPTH_SPAN) -> list[dict]:
    """Attributes (a dict with text keys) as OTLP key-values, each value checked."""
    if attributes is None:
        return []
    if type(attributes) is not dict:
        raise _Invalid(f"attributes are {_type_name(attributes)}, not an object")
    out = []
    for k, v in attributes.items():
        if type(k) is not str:
            raise _Invalid(f"attribute key {k!r} is not text")
        out.append({"key": k, "value": any_value(v, depth)})
    return out


def _hex_id(value: Any, digits: int, what: str, *, zero_ok: bool = False) -> str:
    if type(value) is not str:
        raise _Invalid(f"{what} is {_type_name(value)}, not {digits} hex digits")
    if len(value) != digits or not _HEX.fullmatch(value.lower()):
        raise _Invalid(f"{what} {value[:40]!r} is not {digits} hex digits")
    if not zero_ok and not value.strip("0"):
        raise _Invalid(f"{what} is all zero")
    return value.lower()


def _time(value: Any, what: str) -> str:
    if type(value) is not int:
        raise _Invalid(f"{what} is {_type_name(value)}, not a time in ns")
    if not 0 <= value <= _INT64_MAX:
        raise _Invalid(f"{what} {value} is out of range for a time in ns")
    return str(value)


def _enum(table: dict[str, int], value: Any, what: str) -> int:
    """A name the decoder wrote (``SERVER``), or a number (an enum value this protobuf does not
    name, kept by the decoder as digits): OTLP's enums are open, int32."""
    if type(value) is str:
        if value in table:
            return table[value]
        if value.isdigit() and len(value) < 11 and int(value) <= _INT32_MAX:
            return int(value)
    elif type(value) is int and 0 <= value <= _INT32_MAX:
        return value
    raise _Invalid(f"{what} {str(value)[:40]!r} is not an OTLP {what}")


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise _Invalid(f"{what} is {_type_name(value)}, not text")
    return value


def _list(value: Any, what: str) -> list:
    if value is None:
        return []
    if type(value) is not list or not all(type(v) is dict for v in value):
        raise _Invalid(f"{what} is {_type_name(value)}, not a list of objects")
    return value


def _span_json(span: dict) -> dict:
    status = span.get("status") or {}
    if type(status) is not dict:
        raise _Invalid(f"status is {_type_name(status)}, not an object")
    out = {
        "traceId": _hex_id(span.get("trace_id"), 32, "trace_id"),
        "spanId": _hex_id(span.get("span_id"), 16, "span_id"),
        "name": _text(span.get("name"), "name"),
        "kind": _enum(_KINDS, span.get("kind", "INTERNAL"), "kind"),
        "startTimeUnixNano": _time(span.get("start_ns"), "start_ns"),
        "endTimeUnixNano": _time(span.get("end_ns"), "end_ns"),
        "attributes": key_values(span.get("attributes")),
        "events": [{"name": _text(e.get("name", ""), "event name"),
                    "timeUnixNano": _time(e.get("time_ns", 0), "event time_ns"),
                    "attributes": key_values(e.get("attributes"), _DEPTH_EVENT)}
                   for e in _list(span.get("events"), "events")],
        "links": [{"traceId": _hex_id(lk.get("trace_id"), 32, "link trace_id", zero_ok=True),
                   "spanId": _hex_id(lk.get("span_id"), 16, "link span_id", zero_ok=True),
                   "attributes": key_values(lk.get("attributes"), _DEPTH_EVENT)}
                  for lk in _list(span.get("links"), "links")],
        "status": {"code": _enum(_CODES, status.get("code", "UNSET"), "status code"),
                   "message": _text(status.get("message", ""), "status message")},
    }
    parent = span.get("parent_span_id")
    if parent:
        out["parentSpanId"] = _hex_id(parent, 16, "parent_span_id")
    elif parent not in (None, ""):
        raise _Invalid(f"parent_span_id is {_type_name(parent)}, not 16 hex digits")
    return out


def span_json(span: dict) -> dict:
    """One span as OTLP/JSON; ExportError (naming the span) for anything the receiver would
    refuse."""
    if type(span) is not dict:
        raise ExportError(f"a span is {_type_name(span)}, not an object")
    try:
        return _span_json(span)
    except _Invalid as exc:
        name = span.get("span_id") if type(span.get("span_id")) is str else "?"
        raise ExportError(f"span {str(name)[:40]!r} ({str(span.get('name'))[:60]!r}): {exc}"
                          ) from None


def trace_request_json(spans: Iterable[dict]) -> dict:
    """One export request: spans grouped by resource, then by instrumentation scope."""
    groups: dict[str, dict[str, list[dict]]] = {}
    resources: dict[str, list[dict]] = {}
    for span in spans:
        encoded = span_json(span)
        resource = span.get("resource") or {}
        try:
            resource_kv = key_values(resource, _DEPTH_RESOURCE)
        except _Invalid as exc:
            raise ExportError(f"span {span['span_id']!r}: resource: {exc}") from None
        key = json.dumps(resource_kv, sort_keys=True, separators=(",", ":"))
        resources[key] = resource_kv
        scope = span.get("scope") or ""
        if type(scope) is not str:
            raise ExportError(f"span {span['span_id']!r}: scope is {_type_name(scope)}, "
                              "not text")
        groups.setdefault(key, {}).setdefault(scope, []).append(encoded)
    return {"resourceSpans": [
        {"resource": {"attributes": resources[key]},
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


def write_lines(traces: Iterable[list[dict]], out: IO[str]) -> int:
    """Every span of ``traces`` as OTLP/JSON lines onto ``out``, a trace never split across
    lines; returns the span count. Raises ExportError at the first invalid span: the caller
    writes ``out`` to a temporary file and keeps it only when this returns."""
    count = 0
    for chunk in _chunks(traces):
        out.write(json.dumps(trace_request_json(chunk), separators=(",", ":"),
                             allow_nan=False) + "\n")
        count += len(chunk)
    return count


def export_json(traces: Iterable[list[dict]], output: str | Path) -> int:
    """Write every span of ``traces`` (``analysis.traces.iter_traces`` of a store or file) to
    ``output`` ('-': stdout) as OTLP/JSON lines, whole or not at all (``safe_io.Output``)."""
    from otel_ttft.tools.safe_io import Output

    with Output(output).open() as f:
        return write_lines(traces, f)
