"""OTLP export requests (protobuf or OTLP/JSON) -> the store's normalized span and metric dicts.

One decoder for everything that arrives: the receiver's HTTP and gRPC bodies and the files the
OpenTelemetry Collector's file exporter writes, so analysis never sees two shapes of the same span.
"""

from __future__ import annotations

import base64
import json
import re
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

__all__ = [
    "OTLPDecodeError",
    "decode_metrics_request",
    "decode_trace_request",
    "metrics_request_from_body",
    "metrics_request_from_json",
    "trace_request_from_body",
    "trace_request_from_json",
]

# OTLP/JSON encodes these bytes fields as hex, protobuf's JSON mapping expects base64.
_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_HEX_ID = re.compile(r"^(?:[0-9a-fA-F]{16}|[0-9a-fA-F]{32})$")


class OTLPDecodeError(ValueError):
    """A body or JSON object is not a valid OTLP export request."""


# --- parsing ------------------------------------------------------------------------------------
def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str) and _HEX_ID.match(value):
                out[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                out[key] = _hex_ids_to_base64(value)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


def _from_json(obj: Any, message: Message) -> Message:
    if not isinstance(obj, dict):
        raise OTLPDecodeError(f"expected a JSON object, got {type(obj).__name__}")
    try:
        return json_format.ParseDict(_hex_ids_to_base64(obj), message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OTLPDecodeError(f"not an OTLP/JSON {type(message).__name__}: {exc}") from None


def _from_body(body: bytes, message: Message, is_json: bool) -> Message:
    if is_json:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise OTLPDecodeError(f"invalid JSON: {exc}") from None
        return _from_json(obj, message)
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
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
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def _enum_name(enum: Any, number: int, prefix: str) -> str:
    try:
        return enum.Name(number).removeprefix(prefix)
    except ValueError:
        return str(number)


def _id(raw: bytes) -> str | None:
    return raw.hex() if raw else None


# --- spans --------------------------------------------------------------------------------------
def _span(span: trace_pb2.Span, resource: dict, scope: str) -> dict:
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": _id(span.parent_span_id),
        "name": span.name,
        "kind": _enum_name(trace_pb2.Span.SpanKind, span.kind, "SPAN_KIND_"),
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
            "code": _enum_name(trace_pb2.Status.StatusCode, span.status.code, "STATUS_CODE_"),
            "message": span.status.message,
        },
    }


def decode_trace_request(request: ExportTraceServiceRequest) -> list[dict]:
    """Every span in the request, normalized (see ``sink.store``)."""
    out = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            out.extend(_span(span, resource, ss.scope.name) for span in ss.spans)
    return out


# --- metrics ------------------------------------------------------------------------------------
def _number(point: Any) -> int | float | None:
    kind = point.WhichOneof("value")
    return None if kind is None else getattr(point, kind)


def _exemplars(point: Any) -> list[dict]:
    return [
        {"trace_id": _id(ex.trace_id), "span_id": _id(ex.span_id), "value": _number(ex)}
        for ex in point.exemplars
    ]


def _temporality(value: int) -> str:
    return _enum_name(metrics_pb2.AggregationTemporality, value, "AGGREGATION_TEMPORALITY_")


def _optional(point: Any, field: str) -> Any:
    return getattr(point, field) if point.HasField(field) else None


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
                     "explicit_bounds": list(p.explicit_bounds),
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
            extra = {"count": int(p.count), "sum": p.sum,
                     "quantiles": [{"quantile": q.quantile, "value": q.value}
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
