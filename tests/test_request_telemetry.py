"""The request path's telemetry without vLLM, per the contrib habit: a fresh SDK tracer and meter
provider with in-memory export per test, handed to the hooks as ``instrument()`` does."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.runtime import config, environment_variables
from otel_ttft.runtime.hooks.request import metrics as request_metrics
from otel_ttft.runtime.hooks.request.state import FirstChunk, RequestRecord
from otel_ttft.runtime.hooks.request.timeline import SCHEDULED
from tests.request_engine import api_part


def _points(data, name):
    """Points of one metric from one collection (exemplars belong to the collection that saw
    them: collect once per test)."""
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == name for p in m.data.data_points]


def _record(ext_id="cmpl-1", capture=False):
    rec = RequestRecord("req-1", ext_id, arrival=100.0)
    rec.queue, rec.streaming = object(), True  # served through a generate call
    rec.flush = FirstChunk()
    rec.flush.first = 100.031  # the first chunk written to the client
    rec.texts = {0: "once upon"} if capture else None
    rec.model, rec.prompt_len, rec.out_tokens = "tiny", 12, 4
    rec.prompt = "a secret prompt" if capture else None
    rec.queued, rec.schedule = 100.004, [(SCHEDULED, 100.010)]
    rec.first_tok, rec.recv, rec.second_tok = 100.030, 100.0305, 100.040
    return rec


def test_gauges_report_the_latest_arrival_per_model(telemetry):
    _, reader, _ = telemetry()
    record = api_part().emitter.metrics.record
    record(0.1, {}, "a", False, waiting=3, kv_usage=0.25)
    record(0.1, {}, "a", False, waiting=5, kv_usage=0.5)
    record(0.1, {}, "b", False, waiting=1, kv_usage=None)
    data = reader.get_metrics_data()
    waiting = {p.attributes[semconv.GEN_AI_REQUEST_MODEL]: p.value
               for p in _points(data, semconv.METRIC_REQUEST_ARRIVAL_WAITING)}
    usage = {p.attributes[semconv.GEN_AI_REQUEST_MODEL]: p.value
             for p in _points(data, semconv.METRIC_REQUEST_ARRIVAL_KV_USAGE)}
    assert waiting == {"a": 5, "b": 1}
    assert usage == {"a": 0.5}  # b's arrival knew no KV usage


def test_ttft_sample_carries_an_exemplar_and_stage_time_sums_per_stage(telemetry):
    _, reader, tracer_provider = telemetry()
    record = api_part().emitter.metrics.record
    span = tracer_provider.get_tracer("t").start_span("llm_request")
    record(0.2, {"queue": 0.05, "prefill": 0.15}, "tiny", True, None,
                                   None, context=trace.set_span_in_context(span),
                                   operation=semconv.GEN_AI_OPERATION_CHAT)
    span.end()
    record(0.1, {"queue": 0.02, "prefill": 0.08}, "tiny", True, None,
                                   None, context=request_metrics.NO_SPAN,
                                   operation=semconv.GEN_AI_OPERATION_CHAT)
    data = reader.get_metrics_data()
    (ttft,) = _points(data, semconv.METRIC_SERVER_TTFT)
    assert ttft.attributes == {semconv.ATTR_REQUEST_COLD: True,
                               semconv.GEN_AI_REQUEST_MODEL: "tiny",
                               semconv.GEN_AI_OPERATION_NAME: "chat",
                               semconv.GEN_AI_PROVIDER_NAME: "vllm"}
    assert ttft.count == 2
    assert list(ttft.explicit_bounds) == list(semconv.TTFT_BUCKETS_S)
    # Only the request with a span of its own leads to a trace.
    assert {e.trace_id for e in ttft.exemplars} == {span.get_span_context().trace_id}
    # Issue 9 (cost): time per stage is summed here and read at export (no SDK call per request)
    stages = {p.attributes[semconv.ATTR_STAGE]: p
              for p in _points(data, semconv.METRIC_REQUEST_STAGE_TIME)}
    assert {k: round(p.value, 9) for k, p in stages.items()} == {"queue": 0.07, "prefill": 0.23}
    assert all(p.attributes[semconv.GEN_AI_PROVIDER_NAME] == "vllm"
               and p.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
               and p.attributes[semconv.ATTR_REQUEST_COLD] is True for p in stages.values())
    (metric,) = [m for rm in data.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == semconv.METRIC_REQUEST_STAGE_TIME]
    assert metric.data.is_monotonic and metric.unit == "s"


def test_no_content_by_default(telemetry):
    exporter, _, _ = telemetry()
    api_part().emitter.emit(_record(), now=100.2)
    (req,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
    assert semconv.GEN_AI_INPUT_MESSAGES not in req.attributes
    assert semconv.GEN_AI_OUTPUT_MESSAGES not in req.attributes
    assert "secret" not in json.dumps(dict(req.attributes))


def test_content_captured_when_opted_in(telemetry):
    exporter, _, _ = telemetry(capture_content=True)
    api_part().emitter.emit(_record("chatcmpl-9", capture=True), now=100.2)
    (req,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
    (message,) = json.loads(req.attributes[semconv.GEN_AI_INPUT_MESSAGES])
    assert message["parts"][0]["content"] == "a secret prompt"
    (answer,) = json.loads(req.attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert answer["parts"][0]["content"] == "once upon"
    assert req.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"


def test_settings_are_read_once_into_a_frozen_config():
    env = {environment_variables.OTEL_TTFT_COLD_REQUESTS: "7",
           environment_variables.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: " TRUE ",
           environment_variables.OTEL_TTFT_DISABLED_HOOKS: "request.flush, ,warmup.compile"}
    cfg = config.Config.from_env(env, tracer_provider="tp")
    assert (cfg.cold_requests, cfg.capture_content, cfg.tracer_provider) == (7, True, "tp")
    assert cfg.disabled_hooks == {"request.flush", "warmup.compile"}
    with pytest.raises(AttributeError):
        cfg.cold_requests = 1  # type: ignore[misc]
    assert config.Config.from_env({environment_variables.OTEL_TTFT_COLD_REQUESTS: "x"}) \
        .cold_requests == environment_variables.DEFAULT_COLD_REQUESTS
    assert config.Config.from_env({environment_variables.OTEL_TTFT_COLD_REQUESTS: "-2"}) \
        .cold_requests == 0
    assert config.Config.from_env({}).capture_content is False


def test_every_otel_ttft_variable_the_code_reads_is_listed():
    import re
    from pathlib import Path

    package = Path(config.__file__).parent
    read = set()
    for path in package.rglob("*.py"):
        if path.name == "environment_variables.py":
            continue
        read |= set(re.findall(r"\bOTEL_TTFT_[A-Z_]+\b", path.read_text()))
    listed = {v for k, v in vars(environment_variables).items() if k.startswith("OTEL_")}
    assert read <= listed, read - listed


def test_instrument_takes_the_providers_and_uninstrument_lets_them_go(monkeypatch):
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor

    monkeypatch.setenv(environment_variables.OTEL_TTFT_COLD_REQUESTS, "5")
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instrumentor = VllmTTFTInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider,
                            skip_dep_check=True)
    try:
        monkeypatch.setenv(environment_variables.OTEL_TTFT_COLD_REQUESTS, "9")  # read once: ignored
        assert instrumentor.state.config.cold_requests == 5
        instrumentor.state.part("request.api").emitter.emit(_record(), now=100.2)
    finally:
        instrumentor.uninstrument()
    assert [s.name for s in exporter.get_finished_spans()].count(semconv.SPAN_REQUEST) == 1
    data = reader.get_metrics_data()
    assert _points(data, semconv.METRIC_SERVER_TTFT)
    assert instrumentor.state is None



def test_a_closed_api_part_emits_nothing_at_exit(telemetry):
    """``bounded_export`` keeps its exit callbacks: a closed part's stays, and does nothing."""
    exporter, _, _ = telemetry()
    part = api_part()
    rec = _record()
    rec.queue = type("Queue", (), {"output": object()})()  # its caller has not taken it yet
    part.book.settling[rec.rid] = rec
    part.close()
    part.settler.at_exit()
    assert not exporter.get_finished_spans()
