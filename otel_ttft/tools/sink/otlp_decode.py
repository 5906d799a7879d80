"""OTLP export requests (protobuf or OTLP/JSON) -> the store's normalized span and metric dicts.

One decoder for everything that arrives: the receiver's HTTP and gRPC bodies and the files the
OpenTelemetry Collector's file exporter writes, so analysis never sees two shapes of the same span.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_ttft import semconv

__all__ = [
    "OTLPDecodeError",
    "check_depth",
    "decode_metrics_request",
    "decode_trace_request",
    "metrics_request_from_body",
    "metrics_request_from_json",
    "trace_request_from_body",
    "trace_request_from_json",
]

# OTLP/JSON encodes ids as hex; protobuf's JSON mapping expects base64. Expected hex digits:
_ID_HEX_DIGITS = {"traceId": 32, "trace_id": 32, "spanId": 16, "span_id": 16,
                  "parentSpanId": 16, "parent_span_id": 16}
_HEX = re.compile(r"^[0-9a-fA-F]*$")
MAX_DEPTH = 64  # OTLP itself nests ~10 deep; the rest is attribute values within attributes
_INT64_MAX = (1 << 63) - 1
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


class OTLPDecodeError(ValueError):
    """A body or JSON object is not a valid OTLP export request; the message says where."""


# --- parsing ------------------------------------------------------------------------------------
def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """Iteratively, so a hostile nesting depth is an error and never a RecursionError."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise OTLPDecodeError(f"JSON nested deeper than {limit} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _hex_ids_to_base64(node: Any, where: str = "") -> Any:
    """Hex ids -> base64, checking each id's length (``abcdef12`` is not a span id)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            digits = _ID_HEX_DIGITS.get(key)
            if digits is not None and isinstance(value, str):
                if value and (len(value) != digits or not _HEX.match(value)):
                    raise OTLPDecodeError(f"{where}.{key}: {value[:40]!r} is not {digits} hex "
                                          "digits")
                out[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                out[key] = _hex_ids_to_base64(value, f"{where}.{key}" if where else key)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(v, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def _from_json(obj: Any, message: Message) -> Message:
    if not isinstance(obj, dict):
        raise OTLPDecodeError(f"expected a JSON object, got {type(obj).__name__}")
    check_depth(obj)
    try:
        return json_format.ParseDict(_hex_ids_to_base64(obj), message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OTLPDecodeError(f"not an OTLP/JSON {type(message).__name__}: {exc}") from None


def _from_body(body: bytes, message: Message, is_json: bool) -> Message:
    if is_json:
        try:
            obj = json.loads(body)
        except RecursionError:
            raise OTLPDecodeError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            raise OTLPDecodeError(f"invalid JSON: {exc}") from None
        return _from_json(obj, message)
    try:
        message.ParseFromString(body)
    except (DecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"invalid protobuf {type(message).__name__}: {exc}") from None
    return message


def trace_request_from_json(obj: Any) -> ExportTraceServiceRequest:
    """An OTLP/JSON object (``{"resourceSpans": [...]}``, hex ids) as the protobuf message."""
    return _from_json(obj, ExportTraceServiceRequest())


def metrics_request_from_json(obj: Any) -> ExportMetricsServiceRequest:
    return _from_json(obj, ExportMetricsServiceRequest())


def trace_request_from_body(body: bytes, *, is_json: bool = False) -> ExportTraceServiceRequest:
    return _from_body(body, ExportTraceServiceRequest(), is_json)


def metrics_request_from_body(
    body: bytes, *, is_json: bool = False
) -> ExportMetricsServiceRequest:
    return _from_body(body, ExportMetricsServiceRequest(), is_json)


# --- values -------------------------------------------------------------------------------------
def any_value(value: AnyValue) -> Any:
    """AnyValue -> str/int/float/bool/list/dict (bytes as hex); an empty value -> None."""
    kind = value.WhichOneof("value")
    if kind in _SCALARS:
        return getattr(value, kind)
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    if kind == "double_value":
        return finite(value.double_value)
    return getattr(value, kind)


_SCALARS = frozenset({"string_value", "int_value", "bool_value"})


def finite(number: float) -> float | str:
    """A non-finite double as OTLP/JSON writes it ("NaN", "Infinity", "-Infinity"): stored JSON
    stays standard, and analysis, which only counts real numbers, skips it."""
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"


def attributes(key_values: Any) -> dict[str, Any]:
    out = {}
    for kv in key_values:  # scalars inline: this runs for every attribute of every span
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out[kv.key] = value.string_value
        else:
            out[kv.key] = getattr(value, kind) if kind in _SCALARS else any_value(value)
    return out


def _enum_name(enum: Any, number: int, prefix: str) -> str:
    try:
        return enum.Name(number).removeprefix(prefix)
    except ValueError:
        return str(number)


def _enum_names(enum: Any, prefix: str) -> dict[int, str]:
    return {number: _enum_name(enum, number, prefix) for number in enum.values()}


_KIND_NAMES = _enum_names(trace_pb2.Span.SpanKind, "SPAN_KIND_")
_STATUS_NAMES = _enum_names(trace_pb2.Status.StatusCode, "STATUS_CODE_")


def _id(raw: bytes) -> str | None:
    return raw.hex() if raw else None


# --- spans --------------------------------------------------------------------------------------
def _span(span: trace_pb2.Span, resource: dict, scope: str) -> dict:
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": _id(span.parent_span_id),
        "name": span.name,
        "kind": _KIND_NAMES.get(span.kind) or str(span.kind),
        "start_ns": int(span.start_time_unix_nano),
        "end_ns": int(span.end_time_unix_nano),
        "attributes": attributes(span.attributes),
        "resource": resource,
        "scope": scope,
        "events": [
            {"name": e.name, "time_ns": int(e.time_unix_nano),
             "attributes": attributes(e.attributes)}
            for e in span.events
        ],
        "links": [
            {"trace_id": lk.trace_id.hex(), "span_id": lk.span_id.hex(),
             "attributes": attributes(lk.attributes)}
            for lk in span.links
        ],
        "status": {
            "code": _STATUS_NAMES.get(span.status.code) or str(span.status.code),
            "message": span.status.message,
        },
    }


def _check_span(span: trace_pb2.Span) -> str | None:
    """Why the span cannot be stored, or None."""
    trace_id, span_id = span.trace_id, span.span_id
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return f"trace_id is {len(trace_id)} bytes (or all zero), must be 16"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"span_id is {len(span_id)} bytes (or all zero), must be 8"
    if len(span.parent_span_id) not in (0, 8):
        return f"parent_span_id is {len(span.parent_span_id)} bytes, must be 8 or empty"
    for name in ("start_time_unix_nano", "end_time_unix_nano"):
        if getattr(span, name) > _INT64_MAX:
            return f"{name} is past the year 2262"
    for i, link in enumerate(span.links):
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            return f"links[{i}] ids must be 16 and 8 bytes"
    return None


def decode_trace_request(request: ExportTraceServiceRequest) -> list[dict]:
    """Every span in the request, normalized (see ``sink.store``). One malformed span rejects the
    whole request with an OTLPDecodeError naming it: the sender learns what it got wrong, and
    the store never holds a span analysis cannot place."""
    out = []
    for resource, scope, span in _checked_spans(request):
        out.append(_span(span, resource, scope))
    return out


def _checked_spans(request: ExportTraceServiceRequest) -> Iterator[tuple[dict, str, Any]]:
    for i, rs in enumerate(request.resource_spans):
        resource = attributes(rs.resource.attributes)
        for j, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for k, span in enumerate(ss.spans):
                problem = _check_span(span)
                if problem:
                    raise OTLPDecodeError(f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}] "
                                          f"({span.name[:60]!r}): {problem}")
                yield resource, scope, span


def decode_trace_rows(request: ExportTraceServiceRequest) -> list[tuple]:
    """The receiver's fast path: the same spans as ``decode_trace_request``, straight into the
    store's row shape (``SpanStore.add_span_rows``) without building the full dict first; the
    fields most spans leave at their defaults are left out, as the store would. One loop with
    each protobuf field read once: this is most of the receiver's CPU per span."""
    rows: list[tuple] = []
    append = rows.append
    attrs_of, stage_key, kind_names = attributes, semconv.ATTR_STAGE, _KIND_NAMES
    for i, rs in enumerate(request.resource_spans):
        resource = attrs_of(rs.resource.attributes)
        for j, ss in enumerate(rs.scope_spans):
            scope = ss.scope.name
            for k, span in enumerate(ss.spans):
                tid, sid, pid = span.trace_id, span.span_id, span.parent_span_id
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                if (len(tid) != 16 or len(sid) != 8 or len(pid) not in (0, 8)
                        or tid == _ZERO_TRACE or sid == _ZERO_SPAN or start > _INT64_MAX
                        or end > _INT64_MAX or span.links):
                    problem = _check_span(span)
                    if problem:
                        raise OTLPDecodeError(f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}] "
                                              f"({span.name[:60]!r}): {problem}")
                attrs = attrs_of(span.attributes)
                rest: dict[str, Any] = {"attributes": attrs, "scope": scope}
                kind = span.kind
                if kind != 1:
                    rest["kind"] = kind_names.get(kind) or str(kind)
                if span.events:
                    rest["events"] = [{"name": e.name, "time_ns": int(e.time_unix_nano),
                                       "attributes": attrs_of(e.attributes)}
                                      for e in span.events]
                if span.links:
                    rest["links"] = [{"trace_id": lk.trace_id.hex(), "span_id": lk.span_id.hex(),
                                      "attributes": attrs_of(lk.attributes)} for lk in span.links]
                if span.HasField("status"):
                    status = span.status
                    if status.code or status.message:
                        rest["status"] = {"code": _STATUS_NAMES.get(status.code)
                                          or str(status.code), "message": status.message}
                stage = attrs.get(stage_key)
                append((tid.hex(), sid.hex(), pid.hex() if pid else None, span.name,
                        stage if type(stage) is str else None, start, end, resource, rest))
    return rows


# --- metrics ------------------------------------------------------------------------------------
def _number(point: Any) -> int | float | str | None:
    kind = point.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(point, kind)
    return finite(value) if kind == "as_double" else value


def _exemplars(point: Any) -> list[dict]:
    return [
        {"trace_id": _id(ex.trace_id), "span_id": _id(ex.span_id), "value": _number(ex)}
        for ex in point.exemplars
    ]


def _temporality(value: int) -> str:
    return _enum_name(metrics_pb2.AggregationTemporality, value, "AGGREGATION_TEMPORALITY_")


def _optional(point: Any, field: str) -> Any:
    return finite(getattr(point, field)) if point.HasField(field) else None


def _points(metric: metrics_pb2.Metric) -> list[tuple[str, Any, dict]]:
    """(type, data point, type-specific fields) for each data point of the metric."""
    kind = metric.WhichOneof("data")
    if kind is None:
        return []
    data = getattr(metric, kind)
    rows = []
    for p in data.data_points:
        if kind == "gauge":
            extra = {"value": _number(p)}
        elif kind == "sum":
            extra = {"value": _number(p), "is_monotonic": data.is_monotonic,
                     "temporality": _temporality(data.aggregation_temporality)}
        elif kind == "histogram":
            extra = {"count": int(p.count), "sum": _optional(p, "sum"),
                     "bucket_counts": [int(c) for c in p.bucket_counts],
                     "explicit_bounds": [finite(b) for b in p.explicit_bounds],
                     "min": _optional(p, "min"), "max": _optional(p, "max"),
                     "temporality": _temporality(data.aggregation_temporality)}
        elif kind == "exponential_histogram":
            extra = {"count": int(p.count), "sum": _optional(p, "sum"), "scale": p.scale,
                     "zero_count": int(p.zero_count),
                     "positive": {"offset": p.positive.offset,
                                  "bucket_counts": [int(c) for c in p.positive.bucket_counts]},
                     "negative": {"offset": p.negative.offset,
                                  "bucket_counts": [int(c) for c in p.negative.bucket_counts]},
                     "min": _optional(p, "min"), "max": _optional(p, "max"),
                     "temporality": _temporality(data.aggregation_temporality)}
        else:  # summary
            extra = {"count": int(p.count), "sum": finite(p.sum),
                     "quantiles": [{"quantile": finite(q.quantile), "value": finite(q.value)}
                                   for q in p.quantile_values]}
        rows.append((kind, p, extra))
    return rows


def decode_metrics_request(request: ExportMetricsServiceRequest) -> list[dict]:
    """One normalized dict per data point."""
    out = []
    for rm in request.resource_metrics:
        resource = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for kind, p, extra in _points(metric):
                    row = {
                        "name": metric.name,
                        "unit": metric.unit,
                        "type": kind,
                        "attributes": attributes(p.attributes),
                        "resource": resource,
                        "scope": sm.scope.name,
                        "time_ns": int(p.time_unix_nano),
                        "start_time_ns": int(p.start_time_unix_nano),
                        **extra,
                    }
                    exemplars = _exemplars(p) if kind != "summary" else []
                    if exemplars:
                        row["exemplars"] = exemplars
                    out.append(row)
    return out
