"""Finished spans as compact msgpack, for the API server's export process (``offload``).

The API process pays only for this (a few microseconds per span with msgspec, a vLLM dependency);
the OTLP encoding (~0.1 ms per 30-attribute span in the SDK's pure-Python encoder) and the HTTP
send happen in the export process, which rebuilds the same ``ReadableSpan`` objects and hands
them to the same OTLP exporter class. Everything the OTLP encoder reads is carried: name, ids,
flags, trace state, parent (and whether it is remote), kind, times, attributes, events, links,
status, resource, instrumentation scope and the dropped counts of attributes, events and links.

A span made finished (``telemetry.finished``) can be encoded as it ends, on its way into the batch
processor's queue: a ``WireSpan`` (``finished_span``) is one untracked object around its bytes
where a ``ReadableSpan`` is a dozen objects that wait for the export, seconds later, in the
garbage collector's view of the busy API server; the batch embeds it as it is.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

VERSION = 3
_MASK64 = (1 << 64) - 1
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode
_ORIGIN = struct.Struct("!H")
_MAX_ORIGINS = 1 << 16


def _attrs(attributes: Any) -> dict[str, Any]:
    return dict(attributes) if attributes else {}


class WireSpan(msgspec.Struct, gc=False):
    """A sampled span already encoded (``data``): its origin (``origin``) in two bytes, then its
    fields. What a batch processor reads of a span before its export is ``context.trace_flags``.
    Not tracked by the garbage collector (it holds bytes alone): it waits in the batch queue for
    up to an export interval, and every tracked object that outlives a young collection brings
    the next one closer (a subclass of ``bytes`` is tracked)."""

    data: bytes
    context: ClassVar[trace.SpanContext] = trace.SpanContext(
        1, 1, False, trace.TraceFlags(trace.TraceFlags.SAMPLED))


class WireTree(msgspec.Struct, gc=False):
    """A sampled span to be built in the export process (``data``: its origin in two bytes, then
    its name, ids, kind, start, the builder's ``module:function`` and the builder's facts): the
    API process only decides its ids and says what it is made of. Untracked, as ``WireSpan``."""

    data: bytes
    context: ClassVar[trace.SpanContext] = WireSpan.context


_WIRE = (WireSpan, WireTree)
_BUILDER_PREFIX = "otel_ttft."  # builders are ours: a batch names nothing else to import
_builders: dict[str, Any] = {}


def tree(origin_index: int, name: str, ctx: Any, kind: Any, start: int, builder: str,
         facts: bytes) -> WireTree:
    """A sampled span that ``builder(facts, name, context, kind, start, resource, scope)``
    builds in the export process (a list of ``ReadableSpan``; ``ValueError`` for bad facts)."""
    return WireTree(_ORIGIN.pack(origin_index) + _encode((
        name, ctx.trace_id >> 64, ctx.trace_id & _MASK64, ctx.span_id, int(ctx.trace_flags),
        list(ctx.trace_state.items()) if ctx.trace_state else None, kind.value, start, builder,
        msgspec.Raw(facts))))


def _builder(name: str) -> Any:
    found = _builders.get(name) if type(name) is str else None
    if found is None:
        module, _, function = name.partition(":") if type(name) is str else ("", "", "")
        if not module.startswith(_BUILDER_PREFIX):
            raise ValueError(f"span builder {name!r}")
        try:
            found = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"span builder {name!r}: {exc}") from exc
        _builders[name] = found
    return found


# (resource, scope) pairs of this process's pre-encoded spans; a span names its pair by index
_origins: list[tuple[Any, Any]] = []
_origin_index: dict[tuple[int, int], int] = {}


def origin(resource: Any, scope: Any) -> int | None:
    """The index ``finished_span`` takes for spans of this resource and scope (a provider's
    tracer: a handful per process); ``None`` once 65536 pairs are known."""
    key = (id(resource), id(scope))
    index = _origin_index.get(key)
    if index is None:
        if len(_origins) >= _MAX_ORIGINS:
            return None
        index = _origin_index[key] = len(_origins)
        _origins.append((resource, scope))  # kept: the ids stay theirs
    return index


def _fields(name: str, ctx: Any, parent: Any, kind: Any, start: int, end: int,
            attributes: Any, events: Sequence[Any], links: Sequence[Any], status: Any,
            dropped_attributes: int, dropped_events: int, dropped_links: int) -> tuple:
    return (
        name, ctx.trace_id >> 64, ctx.trace_id & _MASK64, ctx.span_id,
        int(ctx.trace_flags), list(ctx.trace_state.items()) if ctx.trace_state else None,
        None if parent is None else (parent.span_id, parent.is_remote),
        kind.value, start, end, attributes,
        [(e.name, e.timestamp, _attrs(e.attributes)) for e in events],
        [(ln.context.trace_id >> 64, ln.context.trace_id & _MASK64, ln.context.span_id,
          int(ln.context.trace_flags), ln.context.is_remote, _attrs(ln.attributes))
         for ln in links],
        status.status_code.value, status.description,
        dropped_attributes, dropped_events, dropped_links)


def finished_span(origin_index: int, name: str, ctx: Any, parent: Any, kind: Any, start: int,
                  end: int, attributes: dict[str, Any], events: Sequence[Any],
                  links: Sequence[Any], status: Any) -> WireSpan:
    """A sampled span, encoded now (``attributes``: what the SDK would keep, nothing dropped;
    ``events`` and ``links``: the SDK's ``Event`` and ``Link``)."""
    dropped = getattr(attributes, "dropped", 0)  # the SDK's ``BoundedAttributes``
    return WireSpan(_ORIGIN.pack(origin_index) + _encode(_fields(
        name, ctx, parent, kind, start, end,
        attributes if type(attributes) is dict else _attrs(attributes), events, links, status,
        dropped, 0, 0)))


def readable(spans: Sequence[Any]) -> list[ReadableSpan]:
    """The batch with every ``WireSpan`` made a ``ReadableSpan`` again (an export in process)."""
    if not any(type(span) in _WIRE for span in spans):
        return list(spans)
    out: list[ReadableSpan] = []
    for span in spans:
        if type(span) in _WIRE:
            out += decode(encode([span]))
        else:
            out.append(span)
    return out


def encode(spans: Sequence[Any]) -> bytes:
    """One batch: ``[VERSION, resources, scopes, rows]``, a row ``[resource, scope, fields]``;
    resources and scopes once each. ``spans``: ``ReadableSpan`` and ``WireSpan`` objects."""
    resources: dict[int, int] = {}
    scopes: dict[int, int] = {}
    resource_rows: list[Any] = []
    scope_rows: list[Any] = []
    rows = []
    for span in spans:
        if type(span) in _WIRE:  # a row of a ``WireTree`` is marked by its four elements
            res, scope = _origins[_ORIGIN.unpack_from(span.data)[0]]
            fields: Any = msgspec.Raw(memoryview(span.data)[_ORIGIN.size:])
        else:
            res, scope = span.resource, span.instrumentation_scope
            fields = _fields(span.name, span.context, span.parent, span.kind, span.start_time,
                             span.end_time, _attrs(span.attributes), span.events, span.links,
                             span.status, span.dropped_attributes, span.dropped_events,
                             span.dropped_links)
        ri = resources.get(id(res))
        if ri is None:
            ri = resources[id(res)] = len(resource_rows)
            resource_rows.append((_attrs(res.attributes), res.schema_url or ""))
        si = scopes.get(id(scope))
        if si is None:
            si = scopes[id(scope)] = len(scope_rows)
            scope_rows.append(None if scope is None else (
                scope.name, scope.version, scope.schema_url,
                _attrs(getattr(scope, "attributes", None))))
        rows.append((ri, si, fields) if type(span) is not WireTree else (ri, si, None, fields))
    return _encode((VERSION, resource_rows, scope_rows, rows))


def _kept(attributes: dict[str, Any]) -> dict[str, Any]:
    """Sequences as the SDK keeps them: tuples (msgpack brings them back as lists)."""
    for key, value in attributes.items():
        if type(value) is list:
            attributes[key] = tuple(value)
    return attributes


def _bounded(attributes: dict[str, Any], dropped: int) -> Any:
    attributes = _kept(attributes)
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
        for row in rows:
            if len(row) == 4:  # a ``WireTree``: its builder makes it here
                ri, si, _, (name, hi, lo, span_id, flags, state, kind, start, builder,
                            facts) = row
                ctx = trace.SpanContext((hi << 64) | lo, span_id, False, trace.TraceFlags(flags),
                                        trace.TraceState(state) if state else None)
                spans += _builder(builder)(facts, name, ctx, kind, start, resources[ri],
                                           scopes[si])
                continue
            ri, si, (name, hi, lo, span_id, flags, state, parent, kind, start, end, attrs,
                     events, links, code, description, dropped_attrs, dropped_events,
                     dropped_links) = row
            trace_id = (hi << 64) | lo
            trace_state = trace.TraceState(state) if state else None
            ctx = trace.SpanContext(trace_id, span_id, False, trace.TraceFlags(flags),
                                    trace_state)
            parent_ctx = None if parent is None else trace.SpanContext(
                trace_id, parent[0], parent[1], trace.TraceFlags(flags), trace_state)
            spans.append(ReadableSpan(
                name, ctx, parent_ctx, resources[ri], _bounded(attrs, dropped_attrs),
                _bounded_list([Event(n, _kept(a), ts) for n, ts, a in events], dropped_events),
                _bounded_list([trace.Link(trace.SpanContext((lh << 64) | ll, sid, remote,
                                                            trace.TraceFlags(lf)), _kept(a))
                               for lh, ll, sid, lf, remote, a in links], dropped_links),
                trace.SpanKind(kind), status=trace.Status(trace.StatusCode(code), description),
                start_time=start, end_time=end, instrumentation_scope=scopes[si]))
        return spans
    except (msgspec.DecodeError, TypeError, ValueError, IndexError, KeyError) as exc:
        raise ValueError(f"not a span batch: {exc}") from exc
