"""A request span made finished (``telemetry.finished``) is the span the tracer would have made:
same content, same sampling, same limits; a processor that wants spans' starts still gets them
through the tracer."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.state import FlushBox, RequestRecord
from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED
from otel_ttft.runtime.telemetry import finished

TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def _record() -> RequestRecord:
    rec = RequestRecord("req-1", "cmpl-1", arrival=100.0)
    rec.trace_headers, rec.streaming = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, True
    rec.flush = FlushBox(armed=True, first=100.031)
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
            list(span.links), span.status.status_code, span.status.description,
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
