"""The API server's span export process: the same spans reach a real OTLP receiver, the batch's
result is the exporter's, and a child that dies or never starts costs no span."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.telemetry import offload, span_wire

ROOT = Path(__file__).resolve().parents[1]


def _varied_spans() -> list:
    """Finished spans with everything the OTLP encoder reads, drops included."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "vllm", "n": 3}, "https://s"),
                              span_limits=SpanLimits(max_span_attributes=6, max_events=1,
                                                     max_links=1))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "1.2", schema_url="https://scope",
                                 attributes={"scope.attr": True})
    remote = SpanContext(0xABCDEF0123456789ABCDEF0123456789, 0x1122334455667788, True,
                         TraceFlags(1), trace.TraceState([("vendor", "v1")]))
    parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    linked = SpanContext(0x0FEDCBA9876543210FEDCBA987654321, 0x99AABBCCDDEEFF00, True,
                         TraceFlags(0))
    span = tracer.start_span("llm_request", context=parent, kind=SpanKind.SERVER,
                             start_time=1_000, links=[Link(linked, {"k": "v"}),
                                                      Link(linked, {"k": "w"})])
    span.set_attributes({"s": "text", "b": False, "i": -7, "f": 0.25, "ls": ("a", "b"),
                         "li": (1, 2), "lf": (0.5,), "dropped": 1, "dropped2": 2})
    span.add_event("preempted", {"before_first_token": True}, timestamp=1_500)
    span.add_event("second", {}, timestamp=1_600)
    span.set_status(Status(StatusCode.ERROR, "engine died"))
    span.end(end_time=2_000)
    with tracer.start_as_current_span("root"), tracer.start_as_current_span("child"):
        pass
    return list(memory.get_finished_spans())


def test_a_batch_encodes_to_the_same_otlp_bytes_after_the_trip() -> None:
    spans = _varied_spans()
    assert spans[0].dropped_attributes == 3 and spans[0].dropped_events == 1
    assert spans[0].dropped_links == 1
    back = span_wire.decode(span_wire.encode(spans))
    assert encode_spans(back).SerializeToString() == encode_spans(spans).SerializeToString()


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x90\x90",
                                  span_wire._encode((1, [], [], [])),  # another version
                                  span_wire._encode((span_wire.VERSION, [], [], [("x",)])),
                                  span_wire._encode((span_wire.VERSION, [[{}, ""]], [None],
                                                     [[0, 0, [0] * 18]])),
                                  span_wire._encode((span_wire.VERSION, [], [],
                                                     [[3, 0, [0] * 18]])),
                                  span_wire._encode((span_wire.VERSION, [[{}, ""]], [None],
                                                     [[0, 0, None, [0] * 10]]))])
def test_anything_else_is_refused_as_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        span_wire.decode(data)


@pytest.fixture
def api_server(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(this_process, "kind", semconv.PROCESS_API_SERVER)
    monkeypatch.setattr(config, "current", config.Config())


def _pipeline(endpoint: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    inner = OTLPSpanExporter()
    exporter = offload.maybe_offload(inner)
    assert isinstance(exporter, offload.OffloadedSpanExporter)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    return provider, exporter


def _emit(provider: TracerProvider, n: int, prefix: str) -> None:
    tracer = provider.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"{prefix}-{i}") as span:
            span.set_attribute("i", i)


def test_spans_reach_the_receiver_through_a_child_process(receiver, api_server,
                                                          monkeypatch) -> None:
    provider, exporter = _pipeline(receiver.http_endpoint + "/v1/traces", monkeypatch)
    _emit(provider, 300, "a")
    assert provider.force_flush(10_000)
    child = exporter.sidecar_pid
    assert child is not None and child != os.getpid()
    spans = receiver.wait_for_spans(lambda s: len(s) >= 300, timeout=20)
    assert sorted(s["name"] for s in spans) == sorted(f"a-{i}" for i in range(300))
    provider.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the export process outlived the exporter's shutdown"


def test_a_request_span_is_built_by_the_child_and_reaches_the_receiver(receiver, api_server,
                                                                       monkeypatch) -> None:
    """A traced request without children: the API process ships its makings, the child builds
    the span (importing our builder) and exports it."""
    from otel_ttft.runtime.hooks.request import spans as request_spans
    from otel_ttft.runtime.hooks.request.state import RequestRecord
    from otel_ttft.runtime.telemetry import finished

    provider, exporter = _pipeline(receiver.http_endpoint + "/v1/traces", monkeypatch)
    shipped = []
    real_tree = span_wire.tree
    monkeypatch.setattr(span_wire, "tree", lambda *a: shipped.append(a) or real_tree(*a))
    monkeypatch.setattr(config, "current", config.Config(
        tracer_provider=provider, request_detail=semconv.DETAIL_AUTO, detail_ratio=0.0))
    request_spans.spans.use_tracer_provider(provider)
    finished.reset()
    try:
        rec = RequestRecord("req-1", "cmpl-shipped", arrival=time.monotonic() - 0.5)
        rec.trace_headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-"
                                            "b7ad6b7169203331-01"}
        rec.first_tok = rec.recv = rec.arrival + 0.02
        rec.model, rec.out_tokens, rec.finish = "tiny", 4, "length"
        request_spans.emit_request(rec, rec.arrival + 0.1)
        assert provider.force_flush(10_000)
        child = exporter.sidecar_pid
    finally:
        finished.reset()
        provider.shutdown()
    assert len(shipped) == 1 and child is not None and child != os.getpid()
    (span,) = receiver.wait_for_spans(
        lambda s: any(x["name"] == semconv.SPAN_REQUEST for x in s), timeout=20)
    assert span["attributes"][semconv.VLLM_REQUEST_ID] == "cmpl-shipped"
    assert span["attributes"][semconv.ATTR_REQUEST_TTFT] == pytest.approx(0.02)
    assert span["attributes"][semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_child_that_dies_costs_no_span(receiver, api_server, monkeypatch) -> None:
    provider, exporter = _pipeline(receiver.http_endpoint + "/v1/traces", monkeypatch)
    _emit(provider, 10, "before")
    assert provider.force_flush(10_000)
    os.kill(exporter.sidecar_pid, signal.SIGKILL)
    time.sleep(0.2)
    _emit(provider, 10, "after")
    assert provider.force_flush(20_000)
    spans = receiver.wait_for_spans(lambda s: len({x["name"] for x in s}) >= 20, timeout=20)
    assert {f"after-{i}" for i in range(10)} <= {s["name"] for s in spans}
    assert exporter.sidecar_pid is None  # exported in process from then on
    provider.shutdown()


def test_the_batch_result_is_the_exporters(api_server, monkeypatch) -> None:
    """Nothing listens there: the child's exporter fails, and so does the batch."""
    from otel_ttft.tools.replay.server import free_port

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                       f"http://127.0.0.1:{free_port()}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    exporter = offload.maybe_offload(OTLPSpanExporter())
    assert exporter.export(_varied_spans()) is SpanExportResult.FAILURE
    assert exporter.sidecar_pid is not None  # the child answered: it is not given up
    exporter.shutdown()


def test_outside_the_api_server_or_switched_off_nothing_changes(receiver, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.http_endpoint + "/v1/traces")
    monkeypatch.setattr(config, "current", config.Config())
    monkeypatch.setattr(this_process, "kind", semconv.PROCESS_ENGINE_CORE)
    exporter = offload.maybe_offload(OTLPSpanExporter())
    assert exporter.export(_varied_spans()) is SpanExportResult.SUCCESS
    assert exporter.sidecar_pid is None  # EngineCore exports in process
    monkeypatch.setattr(config, "current",
                        config.Config.from_env({"OTEL_TTFT_EXPORT_OFFLOAD": "false"}))
    plain = OTLPSpanExporter()
    assert offload.maybe_offload(plain) is plain


def test_an_exporter_given_another_endpoint_in_code_stays_in_process(api_server,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    mine = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert offload.maybe_offload(mine) is mine
    memory = InMemorySpanExporter()
    assert offload.maybe_offload(memory) is memory


def _sidecar(stdin: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_ttft.runtime.telemetry.offload_sidecar",
                           *args], input=stdin, capture_output=True, timeout=60, cwd=ROOT)


def test_the_child_refuses_what_it_cannot_rebuild_or_read() -> None:
    assert _sidecar(b"", "os:system").returncode == 2
    assert _sidecar(b"").returncode == 2
    http = next(iter(sorted(offload.ELIGIBLE)))
    garbage = b"not msgpack"
    out = _sidecar(struct.pack("!I", len(garbage)) + garbage, http)
    assert out.returncode == 0 and out.stdout == b"0"  # answered "not delivered", kept going
    assert _sidecar(struct.pack("!I", 1 << 31), http).returncode == 2  # a length bomb
    assert _sidecar(b"\x00\x00", http).returncode == 0  # truncated: end of input
