"""A request span made finished (``telemetry.finished``) is the span the tracer would have made:
same content, same sampling, same limits; a processor that wants spans' starts still gets them
through the tracer."""

from __future__ import annotations

import sys

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, TraceFlags

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED
from otel_ttft.runtime.telemetry import finished, offload, sdk_internals, span_wire
from otel_ttft.runtime.telemetry.inflight import InflightTracker
from otel_ttft.runtime.telemetry.pipeline import StageTagger

TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _record() -> RequestRecord:
    rec = RequestRecord("req-1", "cmpl-1", arrival=100.0)
    rec.trace_headers, rec.streaming = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, True
    rec.flushed = 100.031  # the first chunk written to the client
    rec.model, rec.prompt_len, rec.out_tokens, rec.finish = "tiny", 12, 4, "length"
    rec.queued = 100.004
    rec.schedule = [(SCHEDULED, 100.010), (PREEMPTED, 100.012), (SCHEDULED, 100.015)]
    rec.first_tok, rec.recv, rec.second_tok = 100.030, 100.0305, 100.040
    rec.engine = EnginePayload(99.0, waiting=3, running=4, free=10, total=40, attempts=3)
    rec.error = "RuntimeError: boom"
    return rec


class StartWatcher(SpanProcessor):
    """A processor that looks at spans as they start (the SDK's spans only then exist)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span, parent_context=None) -> None:
        self.started.append(span.name)


def _emit(telemetry, *extra, **provider_args):
    exporter, _, _ = telemetry(request_detail=semconv.DETAIL_ALL)
    provider = TracerProvider(**provider_args)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for processor in extra:
        provider.add_span_processor(processor)
    config.configure(config.Config(tracer_provider=provider,
                                   meter_provider=config.current.meter_provider,
                                   request_detail=semconv.DETAIL_ALL))
    request_spans.spans.use_tracer_provider(provider)
    finished.reset()
    request_spans.emit_request(_record(), now=100.2)
    return {s.name: s for s in exporter.get_finished_spans()}


def _content(span):
    return (span.name, span.kind, span.parent, dict(span.attributes),
            [(e.name, dict(e.attributes), e.timestamp) for e in span.events],
            [(link.context, dict(link.attributes)) for link in span.links],
            span.status.status_code, span.status.description,
            span.start_time, span.end_time, span.resource, span.instrumentation_scope,
            span.context.trace_id, span.context.trace_flags, span.context.is_remote)


def test_made_finished_it_is_the_span_the_tracer_makes(telemetry, monkeypatch):
    ended = []
    real_end = finished.FinishedSpan.end
    monkeypatch.setattr(finished.FinishedSpan, "end",
                        lambda self, end_time: (ended.append(self.name), real_end(self, end_time)))
    fast = _emit(telemetry)
    assert ended == [semconv.SPAN_REQUEST]  # made finished
    watcher = StartWatcher()
    slow = _emit(telemetry, watcher)
    assert ended == [semconv.SPAN_REQUEST]  # not this time: a processor wants the start
    assert semconv.SPAN_REQUEST in watcher.started
    assert fast.keys() == slow.keys()
    req_fast, req_slow = fast[semconv.SPAN_REQUEST], slow[semconv.SPAN_REQUEST]
    assert _content(req_fast) == _content(req_slow)
    assert format(req_fast.parent.span_id, "016x") == PARENT_ID
    assert req_fast.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert [e.name for e in req_fast.events] == [semconv.EVENT_REQUEST_PREEMPTED]
    for name, child in fast.items():  # children hang from the request span made finished
        if name != semconv.SPAN_REQUEST:
            assert child.parent.span_id == req_fast.context.span_id


def test_the_sampler_decides_as_for_the_tracer(telemetry):
    assert _emit(telemetry, sampler=ALWAYS_OFF) == {}


def test_span_limits_apply_as_in_the_tracer(telemetry):
    limits = SpanLimits(max_span_attributes=5, max_attribute_length=3)
    fast = _emit(telemetry, span_limits=limits)[semconv.SPAN_REQUEST]
    slow = _emit(telemetry, StartWatcher(), span_limits=limits)[semconv.SPAN_REQUEST]
    assert len(fast.attributes) == 5 and fast.dropped_attributes > 0
    assert _content(fast) == _content(slow)
    assert all(len(v) <= 3 for v in fast.attributes.values() if isinstance(v, str))


@pytest.mark.parametrize("value", [{"a": 1}, None, [1, "x"], b"bytes"])
def test_an_attribute_the_sdk_would_clean_is_cleaned_by_it(telemetry, monkeypatch, value):
    """Values outside what the SDK keeps as they are go through its own cleaning, whatever it
    makes of them."""
    real = request_spans.span_attributes
    monkeypatch.setattr(request_spans, "span_attributes",
                        lambda *a, **k: {**real(*a, **k), "odd": value})
    fast = _emit(telemetry)[semconv.SPAN_REQUEST]
    slow = _emit(telemetry, StartWatcher())[semconv.SPAN_REQUEST]
    assert _content(fast) == _content(slow)


class WireExporter(InMemorySpanExporter):
    """Takes spans encoded as they end, as the API server's export process does; decodes them
    as it would."""

    takes_wire_spans = True

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[type] = []

    def export(self, spans):
        self.kinds += [type(s) for s in spans]
        return super().export(span_wire.readable(spans))


def _emit_batched(telemetry, *extra):
    """Through a batch processor over a ``WireExporter``, our own processors beside it (they
    ignore the request span's end), as in the API server."""
    telemetry(request_detail=semconv.DETAIL_ALL)
    wire = WireExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(wire))
    provider.add_span_processor(StageTagger())
    provider.add_span_processor(InflightTracker())
    for processor in extra:
        provider.add_span_processor(processor)
    config.configure(config.Config(tracer_provider=provider,
                                   meter_provider=config.current.meter_provider,
                                   request_detail=semconv.DETAIL_ALL))
    request_spans.spans.use_tracer_provider(provider)
    finished.reset()
    request_spans.emit_request(_record(), now=100.2)
    provider.force_flush()
    provider.shutdown()
    spans = {s.name: s for s in wire.get_finished_spans()}
    return spans, dict(zip((s.name for s in wire.get_finished_spans()), wire.kinds, strict=True))


def test_the_request_span_reaches_the_export_process_encoded_and_unchanged(telemetry):
    wired, kinds = _emit_batched(telemetry)
    assert kinds[semconv.SPAN_REQUEST] is span_wire.WireSpan  # encoded as it ended
    assert {k for name, k in kinds.items() if name != semconv.SPAN_REQUEST} == {ReadableSpan}
    plain = _emit(telemetry)
    req_wired, req_plain = wired[semconv.SPAN_REQUEST], plain[semconv.SPAN_REQUEST]
    assert _content(req_wired) == _content(req_plain)
    # what the OTLP exporter sends, ids aside, is the same
    assert encode_spans([req_wired]).SerializeToString().replace(
        req_wired.context.span_id.to_bytes(8, "big"), b"") \
        == encode_spans([req_plain]).SerializeToString().replace(
        req_plain.context.span_id.to_bytes(8, "big"), b"")
    for name, child in wired.items():  # children hang from the encoded request span
        if name != semconv.SPAN_REQUEST:
            assert child.parent.span_id == req_wired.context.span_id


def test_a_processor_that_reads_span_ends_gets_the_readable_span(telemetry):
    memory = InMemorySpanExporter()
    _, kinds = _emit_batched(telemetry, SimpleSpanProcessor(memory))
    assert kinds[semconv.SPAN_REQUEST] is ReadableSpan
    assert semconv.SPAN_REQUEST in {s.name for s in memory.get_finished_spans()}


def test_an_export_in_process_gets_readable_spans_again(telemetry):
    """The export process failed: the batches already encoded are exported here, decoded."""
    wired, _ = _emit_batched(telemetry)
    inner = InMemorySpanExporter()
    exporter = offload.OffloadedSpanExporter(inner)
    exporter._broken = True
    assert not exporter.takes_wire_spans
    span = wired[semconv.SPAN_REQUEST]
    origin = span_wire.origin(span.resource, span.instrumentation_scope)
    encoded = span_wire.finished_span(origin, span.name, span.context, span.parent, span.kind,
                                      span.start_time, span.end_time, dict(span.attributes),
                                      span.events, span.links, span.status)
    exporter.export([encoded])
    (back,) = inner.get_finished_spans()
    assert type(back) is ReadableSpan and _content(back) == _content(span)


def test_a_sampler_that_must_be_asked_is_asked(telemetry):
    """Not one of the SDK's static samplers: asked, with the parent in a context as usual."""
    assert _emit(telemetry, sampler=TraceIdRatioBased(0.0)) == {}
    assert semconv.SPAN_REQUEST in _emit(telemetry, sampler=TraceIdRatioBased(1.0))


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF, ParentBased(ALWAYS_ON),
                                     ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF,
                                                 local_parent_not_sampled=ALWAYS_ON)])
def test_static_decisions_are_the_samplers_own(sampler):
    decisions = sdk_internals.static_decisions(sampler)
    assert decisions is not None
    for parent in [None] + [SpanContext(7, 9, remote, TraceFlags(flags))
                            for remote in (True, False) for flags in (0, 1)]:
        context = (trace.set_span_in_context(trace.NonRecordingSpan(parent))
                   if parent is not None else None)
        assert sdk_internals.static_decision(decisions, parent) \
            is sampler.should_sample(context, 7, "x").decision


def test_other_samplers_have_no_static_decisions():
    assert sdk_internals.static_decisions(ParentBased(TraceIdRatioBased(0.5))) is None
    assert sdk_internals.static_decisions(TraceIdRatioBased(0.5)) is None


def _warm_record() -> RequestRecord:
    """A traced request with no reason for children (warm, fast, no failure): its span is
    shipped; with everything its attributes and events read."""
    from types import SimpleNamespace

    from otel_ttft.runtime.hooks.activation import Activation

    rec = _record()
    rec.error = None
    rec.late_preemptions = [100.05]
    rec.lora = SimpleNamespace(lora_name="adapter-a", lora_int_id=3)
    rec.activation = Activation("start", SpanContext(0xFEDCBA9876543210FEDCBA9876543210,
                                                     0xF678000000000001, False, TraceFlags(1)),
                                start_ns=1, ready_ns=99_000_000_000)
    rec.cold_index, rec.preemptions, rec.cached = 40, 2, 8
    rec.vllm = {"gen_ai.latency.e2e": 0.2, semconv.VLLM_REQUEST_ID: "cmpl-1"}
    rec.params = (0.7, 0.9, 5, 16, 0.0, 0.0, 42, 1)
    return rec


def _emit_warm(telemetry, *extra, wire: bool = True, **provider_args):
    """The default policy without a sampled share: a traced warm request's span alone."""
    exporter, _, _ = telemetry(request_detail=semconv.DETAIL_AUTO, detail_ratio=0.0)
    target = WireExporter() if wire else exporter
    provider = TracerProvider(**provider_args)
    provider.add_span_processor(BatchSpanProcessor(target) if wire
                                else SimpleSpanProcessor(target))
    for processor in extra:
        provider.add_span_processor(processor)
    config.configure(config.Config(tracer_provider=provider,
                                   meter_provider=config.current.meter_provider,
                                   request_detail=semconv.DETAIL_AUTO, detail_ratio=0.0))
    request_spans.spans.use_tracer_provider(provider)
    finished.reset()
    request_spans.emit_request(_warm_record(), now=100.2)
    provider.force_flush()
    provider.shutdown()
    spans = target.get_finished_spans()
    return ({s.name: s for s in spans},
            dict(zip((s.name for s in spans), target.kinds, strict=True)) if wire else {})


def test_a_span_without_children_is_built_in_the_export_process_as_it_would_be_here(telemetry):
    shipped, kinds = _emit_warm(telemetry)
    assert kinds == {semconv.SPAN_REQUEST: span_wire.WireTree}  # its makings, not the span
    here, _ = _emit_warm(telemetry, wire=False)
    assert shipped.keys() == here.keys() == {semconv.SPAN_REQUEST}
    built, made = shipped[semconv.SPAN_REQUEST], here[semconv.SPAN_REQUEST]
    assert _content(built) == _content(made)
    assert encode_spans([built]).SerializeToString().replace(
        built.context.span_id.to_bytes(8, "big"), b"") \
        == encode_spans([made]).SerializeToString().replace(
        made.context.span_id.to_bytes(8, "big"), b"")
    attrs = built.attributes
    assert attrs[semconv.ATTR_LORA_NAME] == "adapter-a" and attrs[semconv.ATTR_LORA_ID] == 3
    assert attrs[semconv.ATTR_REQUEST_ACTIVATION_INDEX] == 40
    assert attrs[semconv.GEN_AI_REQUEST_SEED] == 42 and attrs["gen_ai.latency.e2e"] == 0.2
    assert [e.attributes[semconv.ATTR_EVENT_BEFORE_FIRST_TOKEN] for e in built.events] \
        == [True, False]
    assert [link.context.span_id for link in built.links] == [0xF678000000000001]
    assert format(built.parent.span_id, "016x") == PARENT_ID and built.parent.is_remote


def test_span_limits_apply_to_a_span_built_in_the_export_process(telemetry):
    limits = SpanLimits(max_span_attributes=5, max_attribute_length=3, max_events=1)
    shipped, kinds = _emit_warm(telemetry, span_limits=limits)
    here, _ = _emit_warm(telemetry, wire=False, span_limits=limits)
    assert kinds == {semconv.SPAN_REQUEST: span_wire.WireTree}
    built = shipped[semconv.SPAN_REQUEST]
    assert len(built.attributes) == 5 and built.dropped_attributes > 0 and len(built.events) == 1
    assert _content(built) == _content(here[semconv.SPAN_REQUEST])


def test_a_span_another_processor_reads_or_with_children_is_built_here(telemetry):
    memory = InMemorySpanExporter()
    _, kinds = _emit_warm(telemetry, SimpleSpanProcessor(memory))
    assert kinds == {semconv.SPAN_REQUEST: ReadableSpan}
    _, kinds = _emit_batched(telemetry)  # every request's children (``all``)
    assert kinds[semconv.SPAN_REQUEST] is span_wire.WireSpan


def test_an_export_in_process_builds_a_shipped_span_here(telemetry):
    """The export process failed: a span shipped before is built in this process."""
    shipped, _ = _emit_warm(telemetry)
    inner = InMemorySpanExporter()
    exporter = offload.OffloadedSpanExporter(inner)
    exporter._broken = True
    span = shipped[semconv.SPAN_REQUEST]
    origin = span_wire.origin(span.resource, span.instrumentation_scope)
    facts = request_spans.span_facts(_warm_record(), _warm_record().engine, span.parent,
                                     span.end_time, 0.031, [], {}, [], None, SpanLimits())
    exporter.export([span_wire.tree(origin, span.name, span.context, span.kind,
                                    span.start_time, request_spans.BUILDER, facts)])
    (back,) = inner.get_finished_spans()
    assert type(back) is ReadableSpan and back.context == span.context
    assert back.attributes[semconv.VLLM_REQUEST_ID] == "cmpl-1"


@pytest.mark.parametrize("builder, facts", [
    ("os:system", []),  # not ours: nothing is imported
    ("otel_ttft.runtime.hooks.request.remote:nothing", []),
    (request_spans.BUILDER, []),
    (request_spans.BUILDER, [request_spans.FACTS_VERSION + 1] + [None] * 30),
    (request_spans.BUILDER, [request_spans.FACTS_VERSION] + ["x"] * 30),
])
def test_a_shipped_span_the_export_process_cannot_build_is_refused(builder, facts):
    batch = span_wire._encode((span_wire.VERSION, [[{}, ""]], [None], [
        [0, 0, None, ["n", 0, 1, 1, 1, None, 1, 0, builder, facts]]]))
    with pytest.raises(ValueError):
        span_wire.decode(batch)


def test_a_value_the_wire_does_not_take_keeps_the_span_here(telemetry, monkeypatch):
    """vLLM's own attributes of a type or size msgpack refuses: built in this process, handed
    over as the SDK's span, not failed."""
    odd = _warm_record

    def record():
        rec = odd()
        rec.vllm = {"odd": object(), "big": 2**70}
        return rec

    monkeypatch.setattr(sys.modules[__name__], "_warm_record", record)
    shipped, kinds = _emit_warm(telemetry)
    assert kinds == {semconv.SPAN_REQUEST: ReadableSpan}
    attrs = shipped[semconv.SPAN_REQUEST].attributes
    assert attrs[semconv.VLLM_REQUEST_ID] == "cmpl-1"
