"""Spans made at their end: a request's ``llm_request`` is built after the request, from the
timestamps vLLM recorded, so it is finished before it is made.

Through the SDK that is ``start_span`` + ``set_attributes`` + ``end``: a ``Span`` with a lock,
every attribute validated and copied twice, then the ``ReadableSpan`` its ``end`` hands to the
processors (about 30 us for a request span of 30 attributes here). ``start_finished`` asks the
sampler and draws the ids exactly as ``start_span`` does, and ``FinishedSpan.end`` hands the same
``ReadableSpan`` to the same processors' ``on_end`` (about half the time, most of it the
sampler's, the ids' and the processors' own), where nothing could tell the
difference: the SDK's own tracer, enabled; every processor's ``on_start`` and ``_on_ending`` the
SDK's no-op (batch, simple exporters) or one of ours that ignores spans of that name
(``ignores_start``); attributes of the types the SDK keeps as they are (anything else goes
through the SDK's own ``BoundedAttributes``, as do span limits tighter than a request span).
Anything else gets ``start_span``. The SDK internals this reads are in ``sdk_internals``.

Where the only processor that wants the span at its end is a batch processor exporting through
the export process (``offload``; every other one ``ignores_end`` spans of that name), ``end``
hands it a ``span_wire.WireSpan`` instead, encoded at once: one object waiting in the queue, and
no ``ReadableSpan``, which the export process builds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, TraceFlags

from otel_ttft.runtime.telemetry import sdk_internals, span_wire, spans

logger = logging.getLogger("otel_ttft")

try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Event, ReadableSpan
except ImportError:  # pragma: no cover - the SDK ships with vLLM
    ReadableSpan = None  # type: ignore[assignment,misc]

_SCALARS = (str, bool, int, float)
_maker: sdk_internals.SpanMaker | None = None
_real: Any = None  # the tracer ``_maker`` was read from (``None`` there: not an SDK tracer)
_start_free: dict[str, bool] = {}  # span name -> no processor wants its start
_wire_routes: dict[str, WireRoute | None] = {}  # span name -> where it goes encoded, if it can
_broken = ReadableSpan is None  # set for good if making a span this way ever fails


def _maker_for(name: str) -> sdk_internals.SpanMaker | None:
    """The tracer's parts, when a span of this name may be made finished (else ``None``)."""
    global _maker, _real
    if _broken:
        return None
    real = sdk_internals.real_tracer(spans.tracer())
    maker = _maker
    if real is not _real or (maker is not None and not sdk_internals.maker_current(maker)):
        _real, _maker = real, sdk_internals.span_maker(real)
        maker = _maker
        _start_free.clear()
        _wire_routes.clear()
    if maker is None:
        return None
    free = _start_free.get(name)
    if free is None:
        free = _start_free[name] = all(
            sdk_internals.start_is_noop(p) or _ignores(p, "ignores_start", name)
            for p in maker.processors)
    return maker if free else None


def _ignores(processor: Any, method: str, name: str) -> bool:
    ignores = getattr(processor, method, None)
    return bool(ignores is not None and ignores(name))


class WireRoute:
    """The one processor that wants spans of a name at their end, when it takes them encoded:
    a batch processor whose exporter ``takes_wire_spans`` (asked at every end: the export
    process may have failed since)."""

    __slots__ = ("processor", "exporter", "origin")

    def __init__(self, processor: Any, exporter: Any, origin: int):
        self.processor, self.exporter, self.origin = processor, exporter, origin


def _wire_route(maker: sdk_internals.SpanMaker, name: str) -> WireRoute | None:
    try:
        return _wire_routes[name]
    except KeyError:
        pass
    route = None
    for processor in maker.processors:
        if _ignores(processor, "ignores_end", name):
            continue
        batch = sdk_internals.batch_processor(processor)
        exporter = sdk_internals.batch_exporter(batch) if batch is not None else None
        if route is not None or getattr(exporter, "takes_wire_spans", None) is None:
            route = None  # another processor reads the span: it gets a ``ReadableSpan``
            break
        origin = span_wire.origin(maker.resource, maker.scope)
        if origin is None:
            break
        route = WireRoute(processor, exporter, origin)
    _wire_routes[name] = route
    return route


class FinishedSpan:
    """A recording span that exists only as what it will carry; ``end`` hands it over."""

    __slots__ = ("maker", "name", "context", "parent", "kind", "start_time", "attributes",
                 "events", "links", "status", "end_metrics", "wire")

    def __init__(self, maker: sdk_internals.SpanMaker, name: str, context: SpanContext,
                 parent: SpanContext | None, kind: SpanKind, start_time: int,
                 attributes: dict[str, Any], links: Sequence[Link], end_metrics: Any):
        self.maker, self.name, self.context, self.parent = maker, name, context, parent
        self.kind, self.start_time, self.attributes = kind, start_time, attributes
        self.links, self.end_metrics = links, end_metrics
        self.wire = _wire_route(maker, name) if context.trace_flags.sampled else None
        self.events: list[tuple[str, Mapping[str, Any], int]] = []
        self.status = Status()

    def is_recording(self) -> bool:
        return True

    def get_span_context(self) -> SpanContext:
        return self.context

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def add_event(self, name: str, attributes: Mapping[str, Any], timestamp: int) -> None:
        self.events.append((name, attributes, timestamp))

    def set_status(self, status: Status) -> None:
        self.status = status

    def ships(self) -> bool:
        """Whether it goes to the export process alone (``offload``): then it may be built there
        (``ship``)."""
        wire = self.wire
        return wire is not None and wire.exporter.takes_wire_spans

    def ship(self, builder: str, facts: bytes) -> None:
        """Ends it by handing the export process what it is made of: ``builder``
        (``module:function``, see ``span_wire.WireTree``) builds it there from ``facts``, with
        this span's name, ids, kind and start. Only where it ``ships``; nothing else is set."""
        if self.end_metrics:
            self.end_metrics()
        wire = self.wire
        wire.processor.on_end(span_wire.tree(wire.origin, self.name, self.context, self.kind,
                                             self.start_time, builder, facts))

    def end(self, end_time: int) -> None:
        maker, limits = self.maker, self.maker.limits
        attributes = _plain(self.attributes, limits.max_span_attributes,
                            limits.max_attribute_length)
        if attributes is None:
            attributes = BoundedAttributes(limits.max_span_attributes, self.attributes,
                                           immutable=True,
                                           max_value_len=limits.max_attribute_length)
        kept = self.events  # the latest ones, as the SDK's bounded list keeps them
        if limits.max_events is not None:
            kept = kept[max(len(kept) - limits.max_events, 0):]
        events = tuple(
            Event(name, BoundedAttributes(limits.max_event_attributes, attrs, immutable=True,
                                          max_value_len=limits.max_attribute_length), ts)
            for name, attrs, ts in kept)
        links = tuple(self.links[: limits.max_links])
        if self.end_metrics:
            self.end_metrics()
        wire = self.wire
        if wire is not None and wire.exporter.takes_wire_spans:
            try:
                encoded = span_wire.finished_span(
                    wire.origin, self.name, self.context, self.parent, self.kind,
                    self.start_time, end_time, attributes, events, links, self.status)
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError):  # the SDK's span
                encoded = None
            if encoded is not None:
                wire.processor.on_end(encoded)
                return
        maker.processor.on_end(ReadableSpan(
            self.name, self.context, self.parent, maker.resource, attributes, events, links,
            kind=self.kind, instrumentation_info=maker.info, status=self.status,
            start_time=self.start_time, end_time=end_time, instrumentation_scope=maker.scope))


def _plain(attributes: dict[str, Any], max_count: int | None,
           max_len: int | None) -> dict[str, Any] | None:
    """The attributes as the SDK would keep them, when that needs no cleaning: within the count
    limit, no value-length limit, scalar values and lists of strings (made tuples). ``None``:
    the SDK's ``BoundedAttributes`` has to clean them."""
    if max_len is not None or (max_count is not None and len(attributes) > max_count):
        return None
    for key, value in attributes.items():
        kind = type(value)
        if kind in _SCALARS and type(key) is str and key:
            continue
        if kind in (list, tuple) and all(type(v) is str for v in value):
            attributes[key] = tuple(value)
            continue
        return None
    return attributes


def start_finished(name: str, *, parent: SpanContext | None,
                   context: otel_context.Context | None, kind: SpanKind, start_time: int,
                   links: Sequence[Link] = ()) -> Any:
    """A span to fill and ``end`` at once: a ``FinishedSpan`` where nothing can tell the
    difference, else the tracer's own span (``start_span``). ``parent``: the parent span's
    context, if any; ``context``: the context it came in, if there is one (else made only for a
    sampler that has to be asked, or for the tracer)."""
    global _broken
    if parent is not None and not parent.is_valid:
        parent = None
    maker = _maker_for(name)
    if maker is not None:
        try:
            return _start(maker, name, parent, context, kind, start_time, links)
        except Exception as exc:  # noqa: BLE001 - an SDK we do not know: the tracer from now on
            _broken = True
            logger.info("otel-ttft: finished spans unavailable (%r); using the tracer", exc)
    return spans.tracer().start_span(name, context=_context(parent, context), kind=kind,
                                     start_time=start_time, links=links)


_ROOT = otel_context.Context()
"""No parent: a new trace (read only, as every context is)."""


def _context(parent: SpanContext | None,
             context: otel_context.Context | None) -> otel_context.Context:
    if context is not None:
        return context
    return trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else _ROOT


def _start(maker: sdk_internals.SpanMaker, name: str, parent: SpanContext | None,
           context: otel_context.Context | None, kind: SpanKind, start_time: int,
           links: Sequence[Link]) -> Any:
    """What ``Tracer.start_span`` does before it makes the span."""
    trace_id = maker.id_generator.generate_trace_id() if parent is None else parent.trace_id
    if maker.static_decisions is not None:  # what the sampler would say, without asking it
        decision = sdk_internals.static_decision(maker.static_decisions, parent)
        trace_state, attributes = (None if parent is None else parent.trace_state), None
    else:
        sampling = maker.sampler.should_sample(_context(parent, context), trace_id, name, kind,
                                               None, links)
        decision, trace_state = sampling.decision, sampling.trace_state
        attributes = sampling.attributes
    flags = TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT
    if (maker.id_generator.is_trace_id_random() if parent is None
            else parent.trace_flags.random_trace_id):
        flags |= TraceFlags.RANDOM_TRACE_ID
    span_context = SpanContext(trace_id, maker.id_generator.generate_span_id(), is_remote=False,
                               trace_flags=TraceFlags(flags), trace_state=trace_state)
    end_metrics = maker.start_metrics(parent, decision)
    if not decision.is_recording():
        return trace.NonRecordingSpan(span_context)
    return FinishedSpan(maker, name, span_context, parent, kind, start_time,
                        dict(attributes) if attributes else {}, links, end_metrics)


def processor_of(span: Any) -> Any | None:
    """Where a recording span's finished children go: its processor, or ``None`` (the tracer)."""
    if isinstance(span, FinishedSpan):
        return span.maker.processor
    return sdk_internals.span_processor_of(span)


def reset() -> None:
    """Look the tracer's parts up again (tests; a new provider is noticed by itself)."""
    global _maker, _real, _broken
    _maker = _real = None
    _broken = ReadableSpan is None
    _start_free.clear()
    _wire_routes.clear()
