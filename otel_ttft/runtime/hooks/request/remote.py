"""A request span built in the API server's export process (``telemetry.offload``).

Measured end to end at concurrency 4 with every request traced upstream, building the request
span in the API process (its attributes, the checks the SDK would make, the encoding) cost that
process about as much again as all the rest of our request path: with the span left out it read
1.026 against 1.047-1.061 with it, and with the span built but never queued or exported 1.051 --
the building, not the export, is the cost (our frames there, and the caches they sweep for
vLLM's next step). So where the span goes only to the export process and has no children, the
API process decides its ids as usual (sampler, id generator: the TTFT sample's exemplar names
them) and hands over what it is made of (``spans.span_facts``: one flat msgpack array of the
record's values), and the export process builds the same span (``build``) with the same code
(``span_attributes``, ``spans.fill``). Requests with children (the detail policy's), content
capture, and every other processor or exporter keep the in-process path.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanLimits

from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request.attributes import span_attributes
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.telemetry import finished, sdk_internals


class _Activation:
    """What ``span_attributes`` and ``_links`` read of ``hooks.activation.Activation``."""

    __slots__ = ("kind", "ready_ns", "span_context")

    def __init__(self, kind: str, ready_ns: int | None,
                 span_context: trace.SpanContext | None):
        self.kind, self.ready_ns, self.span_context = kind, ready_ns, span_context


class _Lora:
    __slots__ = ("lora_name", "lora_int_id")

    def __init__(self, name: str, int_id: int):
        self.lora_name, self.lora_int_id = name, int_id


class _Collect:
    """The span processor of a span built here: keeps what ends."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_end(self, span: Any) -> None:
        self.spans.append(span)


def _pairs(rows: Any) -> list[tuple[Any, Any]]:
    return [tuple(row) for row in rows or ()]


def build(data: Any, name: str, context: trace.SpanContext, kind: int, start_ns: int,
          resource: Any, scope: Any) -> list[Any]:
    """The ``ReadableSpan`` that ``spans.span_facts`` describes (in the export process, or in
    the API process when that export fails over to it); ``ValueError`` for anything else."""
    try:
        (version, offset, limits, parent, ext_id, arrival, end_ns, vllm, model, prompt_len,
         out_tokens, cached, params, finish, ttft, served, streaming, aborted, rejected, lora,
         act, cold_index, cold, first_tok, late, preemptions, eng, schedule, stages, fills,
         error) = data
        if version != request_spans.FACTS_VERSION:
            raise ValueError(f"request span facts version {version!r}")
        if type(offset) is not int:
            raise ValueError(f"clock offset {offset!r}")
        rec = RequestRecord(rid="", ext_id=ext_id, arrival=arrival, vllm=vllm, model=model,
                            prompt_len=prompt_len, out_tokens=out_tokens, cached=cached,
                            params=None if params is None else tuple(params), finish=finish,
                            taken=served, streaming=streaming, aborted=aborted,
                            rejected=rejected, cold_index=cold_index, cold=cold,
                            first_tok=first_tok, late_preemptions=list(late or ()),
                            preemptions=preemptions)
        if lora is not None:
            rec.lora = _Lora(*lora)
        if act is not None:
            link = act[2]
            rec.activation = _Activation(act[0], act[1], None if link is None else (
                trace.SpanContext((link[0] << 64) | link[1], link[2], False,
                                  trace.TraceFlags(link[3]))))
        payload = None if eng is None else EnginePayload(
            eng[0], eng[1], eng[2], eng[3], eng[4], eng[5], _pairs(eng[6]),
            None if eng[7] is None else tuple(eng[7]), _pairs(eng[8]))
        schedule = _pairs(schedule)
        fills = [tuple(fill) for fill in fills]
        attributes = span_attributes(rec, payload, ttft, schedule, stages, fills)
        events = request_spans.preemption_events(rec, schedule)
        links = request_spans.activation_links(rec)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise ValueError(f"not request span facts: {exc}") from exc
    # The API process's clock offset (inherited by this process, so the same one, unless the
    # wall clock stepped between the two starts): every time it carries is read on it.
    clock.EPOCH_OFFSET_NS = offset
    collect = _Collect()
    maker = sdk_internals.SpanMaker(
        None, None, None, collect, (collect,), resource, scope, None,
        SpanLimits(max_span_attributes=limits[0], max_attribute_length=limits[1],
                   max_events=limits[2], max_event_attributes=limits[3], max_links=limits[4]),
        None)
    parent_ctx = None if parent is None else trace.SpanContext(
        context.trace_id, parent[0], parent[1], context.trace_flags, context.trace_state)
    span = finished.FinishedSpan(maker, name, context, parent_ctx, trace.SpanKind(kind),
                                 start_ns, {}, links, None)
    span.wire = None  # built here: for this processor alone
    request_spans.fill(span, [], None, [], attributes, events, error, None)
    span.end(end_time=end_ns)
    return collect.spans



