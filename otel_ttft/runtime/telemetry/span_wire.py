"""Finished spans as compact msgpack, for the API server's export process (``offload``).

The API process pays only for this (a few microseconds per span with msgspec, a vLLM dependency);
the OTLP encoding (~0.1 ms per 30-attribute span in the SDK's pure-Python encoder) and the HTTP
send happen in the export process, which rebuilds the same ``ReadableSpan`` objects and hands
them to the same OTLP exporter class. Everything the OTLP encoder reads is carried: name, ids,
flags, trace state, parent (and whether it is remote), kind, times, attributes, events, links,
status, resource, instrumentation scope and the dropped counts of attributes, events and links.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

VERSION = 1
_MASK64 = (1 << 64) - 1
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def _attrs(attributes: Any) -> dict[str, Any]:
    return dict(attributes) if attributes else {}


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """One batch: ``[VERSION, resources, scopes, rows]``; resources and scopes once each."""
    resources: dict[int, int] = {}
    scopes: dict[int, int] = {}
    resource_rows: list[Any] = []
    scope_rows: list[Any] = []
    rows = []
    for span in spans:
        res = span.resource
        ri = resources.get(id(res))
        if ri is None:
            ri = resources[id(res)] = len(resource_rows)
            resource_rows.append((_attrs(res.attributes), res.schema_url or ""))
        scope = span.instrumentation_scope
        si = scopes.get(id(scope))
        if si is None:
            si = scopes[id(scope)] = len(scope_rows)
            scope_rows.append(None if scope is None else (
                scope.name, scope.version, scope.schema_url,
                _attrs(getattr(scope, "attributes", None))))
        ctx = span.context
        parent = span.parent
        status = span.status
        rows.append((
            span.name, ctx.trace_id >> 64, ctx.trace_id & _MASK64, ctx.span_id,
            int(ctx.trace_flags), list(ctx.trace_state.items()) if ctx.trace_state else None,
            None if parent is None else (parent.span_id, parent.is_remote),
            span.kind.value, span.start_time, span.end_time, _attrs(span.attributes),
            [(e.name, e.timestamp, _attrs(e.attributes)) for e in span.events],
            [(ln.context.trace_id >> 64, ln.context.trace_id & _MASK64, ln.context.span_id,
              int(ln.context.trace_flags), ln.context.is_remote, _attrs(ln.attributes))
             for ln in span.links],
            status.status_code.value, status.description, ri, si,
            span.dropped_attributes, span.dropped_events, span.dropped_links))
    return _encode((VERSION, resource_rows, scope_rows, rows))


def _bounded(attributes: dict[str, Any], dropped: int) -> Any:
    if not dropped:
        return attributes
    bounded = BoundedAttributes(None, attributes, immutable=True)
    bounded.dropped = dropped
    return bounded


def _bounded_list(items: list[Any], dropped: int) -> Any:
    if not dropped:
        return items
    bounded = BoundedList.from_seq(None, items)
    bounded.dropped = dropped
    return bounded


def decode(data: bytes) -> list[ReadableSpan]:
    """The batch :func:`encode` wrote, as ``ReadableSpan`` objects; ``ValueError`` for anything
    else."""
    try:
        version, resource_rows, scope_rows, rows = _decode(data)
        if version != VERSION:
            raise ValueError(f"span batch version {version!r}")
        resources = [Resource(attrs, schema or None) for attrs, schema in resource_rows]
        scopes = [None if row is None else InstrumentationScope(row[0], row[1], row[2], row[3])
                  for row in scope_rows]
        spans = []
        for (name, hi, lo, span_id, flags, state, parent, kind, start, end, attrs, events, links,
             code, description, ri, si, dropped_attrs, dropped_events, dropped_links) in rows:
            trace_id = (hi << 64) | lo
            trace_state = trace.TraceState(state) if state else None
            ctx = trace.SpanContext(trace_id, span_id, False, trace.TraceFlags(flags),
                                    trace_state)
            parent_ctx = None if parent is None else trace.SpanContext(
                trace_id, parent[0], parent[1], trace.TraceFlags(flags), trace_state)
            spans.append(ReadableSpan(
                name, ctx, parent_ctx, resources[ri], _bounded(attrs, dropped_attrs),
                _bounded_list([Event(n, a, ts) for n, ts, a in events], dropped_events),
                _bounded_list([trace.Link(trace.SpanContext((lh << 64) | ll, sid, remote,
                                                            trace.TraceFlags(lf)), a)
                               for lh, ll, sid, lf, remote, a in links], dropped_links),
                trace.SpanKind(kind), status=trace.Status(trace.StatusCode(code), description),
                start_time=start, end_time=end, instrumentation_scope=scopes[si]))
        return spans
    except (msgspec.DecodeError, TypeError, ValueError, IndexError, KeyError) as exc:
        raise ValueError(f"not a span batch: {exc}") from exc
