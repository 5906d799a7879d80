"""The embedded receiver against the real OTel SDK exporters, over loopback."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore

RESOURCE = Resource.create({"service.name": "sink-test", "vllm.process_kind": "worker"})


def _make_spans() -> list:
    """A parent with typed attributes and an event, a child linked to a third span."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_ttft.test")
    with tracer.start_as_current_span("other") as other:
        pass
    with tracer.start_as_current_span("Load model", kind=trace.SpanKind.SERVER) as parent:
        parent.set_attributes({
            "ttft.stage": "load", "ttft.load.bytes": 3_400_000, "ttft.load.gb_per_s": 1.5,
            "ttft.compile.cache_hit": False, "ttft.graph.batch_sizes": [1, 2, 4],
        })
        parent.add_event("shard done", {"ttft.load.shard.index": 1})
        link = trace.Link(other.get_span_context(), {"why": "waited"})
        with tracer.start_as_current_span("Read checkpoint shard", links=[link]) as child:
            child.set_status(trace.Status(trace.StatusCode.ERROR, "disk"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def _by_name(spans: list[dict]) -> dict[str, dict]:
    return {s["name"]: s for s in spans}


def _check_normalized(stored: list[dict], sent: list) -> None:
    got = _by_name(stored)
    assert set(got) == {"other", "Load model", "Read checkpoint shard"}
    parent, child, other = got["Load model"], got["Read checkpoint shard"], got["other"]
    sent_parent = next(s for s in sent if s.name == "Load model")
    assert parent["trace_id"] == f"{sent_parent.context.trace_id:032x}"
    assert parent["span_id"] == f"{sent_parent.context.span_id:016x}"
    assert len(parent["trace_id"]) == 32 and len(parent["span_id"]) == 16
    assert parent["parent_span_id"] is None
    assert child["parent_span_id"] == parent["span_id"]
    assert child["trace_id"] == parent["trace_id"]
    assert parent["kind"] == "SERVER" and child["kind"] == "INTERNAL"
    assert parent["start_ns"] == sent_parent.start_time
    assert parent["end_ns"] == sent_parent.end_time
    assert parent["attributes"] == {
        "ttft.stage": "load", "ttft.load.bytes": 3_400_000, "ttft.load.gb_per_s": 1.5,
        "ttft.compile.cache_hit": False, "ttft.graph.batch_sizes": [1, 2, 4],
    }
    assert parent["resource"]["service.name"] == "sink-test"
    assert parent["resource"]["vllm.process_kind"] == "worker"
    assert parent["scope"] == "otel_ttft.test"
    (event,) = parent["events"]
    assert event["name"] == "shard done" and event["attributes"] == {"ttft.load.shard.index": 1}
    assert isinstance(event["time_ns"], int) and event["time_ns"] >= parent["start_ns"]
    assert child["links"] == [{"trace_id": other["trace_id"], "span_id": other["span_id"],
                               "attributes": {"why": "waited"}}]
    assert child["status"] == {"code": "ERROR", "message": "disk"}
    assert parent["status"]["code"] == "UNSET"


def test_http_protobuf_gzip_spans(receiver: OTLPReceiver) -> None:
    sent = _make_spans()
    exporter = OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces",
                                compression=Compression.Gzip)
    assert exporter.export(sent) == SpanExportResult.SUCCESS
    exporter.shutdown()
    _check_normalized(receiver.store.spans(), sent)


def test_grpc_spans(receiver: OTLPReceiver) -> None:
    sent = _make_spans()
    exporter = GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True)
    assert exporter.export(sent) == SpanExportResult.SUCCESS
    exporter.shutdown()
    spans = receiver.wait_for_spans(lambda s: len(s) >= 3, timeout=10)
    _check_normalized(spans, sent)


def test_metrics_http(receiver: OTLPReceiver) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("otel_ttft.test")
    hist = meter.create_histogram("ttft.activation.stage.duration", unit="s",
                                  explicit_bucket_boundaries_advisory=[1, 10, 100])
    counter = meter.create_counter("ttft.load.read.bytes", unit="By")
    tracer = TracerProvider(resource=RESOURCE).get_tracer("t")
    with tracer.start_as_current_span("activation") as span:
        hist.record(0.5, {"ttft.stage": "load"})
        hist.record(42.0, {"ttft.stage": "load"})
    counter.add(1000, {"ttft.load.format": "safetensors"})
    exporter = OTLPMetricExporter(endpoint=f"{receiver.http_endpoint}/v1/metrics")
    assert exporter.export(reader.get_metrics_data()) == MetricExportResult.SUCCESS
    exporter.shutdown()
    provider.shutdown()

    points = {p["name"]: p for p in receiver.store.metric_points()}
    h = points["ttft.activation.stage.duration"]
    assert h["type"] == "histogram" and h["unit"] == "s"
    assert h["count"] == 2 and h["sum"] == pytest.approx(42.5)
    assert h["explicit_bounds"] == [1.0, 10.0, 100.0]
    assert h["bucket_counts"] == [1, 0, 1, 0]
    assert h["attributes"] == {"ttft.stage": "load"}
    assert h["resource"]["service.name"] == "sink-test"
    assert isinstance(h["time_ns"], int) and h["time_ns"] > 0
    ctx = span.get_span_context()
    assert {(e["trace_id"], e["span_id"]) for e in h["exemplars"]} == {
        (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")}
    c = points["ttft.load.read.bytes"]
    assert c["type"] == "sum" and c["value"] == 1000 and c["unit"] == "By"


def _post(url: str, body: bytes, ctype: str, encoding: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


OTLP_JSON = {"resourceSpans": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json"}}]},
    "scopeSpans": [{"scope": {"name": "file"}, "spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
        "parentSpanId": "eee19b7ec3c1b173", "name": "Load weights", "kind": 1,
        "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": "1544712661000000000",
        "attributes": [{"key": "ttft.load.shards", "value": {"intValue": "4"}},
                       {"key": "ttft.stage", "value": {"stringValue": "load"}}],
        "links": [{"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331"}],
        "status": {"code": 2, "message": "boom"},
    }]}],
}]}


def test_json_body_raw_post(receiver: OTLPReceiver) -> None:
    url = f"{receiver.http_endpoint}/v1/traces"
    body = json.dumps(OTLP_JSON).encode()
    status, payload = _post(url, gzip.compress(body), "application/json", "gzip")
    assert status == 200 and json.loads(payload) == {}
    (span,) = receiver.store.spans()
    assert span["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert span["span_id"] == "eee19b7ec3c1b174"
    assert span["parent_span_id"] == "eee19b7ec3c1b173"
    assert span["start_ns"] == 1544712660000000000 and span["kind"] == "INTERNAL"
    assert span["attributes"] == {"ttft.load.shards": 4, "ttft.stage": "load"}
    assert span["links"][0]["span_id"] == "b7ad6b7169203331"
    assert span["status"] == {"code": "ERROR", "message": "boom"}
    assert span["resource"] == {"service.name": "json"} and span["scope"] == "file"


def test_http_errors(receiver: OTLPReceiver) -> None:
    base = receiver.http_endpoint
    assert _post(f"{base}/v1/traces", b"{not json", "application/json")[0] == 400
    assert _post(f"{base}/v1/traces", b"\xff\xff\xff", "application/x-protobuf")[0] == 400
    assert _post(f"{base}/v1/traces", b"xx", "application/x-protobuf", "gzip")[0] == 400
    assert _post(f"{base}/v1/logs", b"", "application/x-protobuf")[0] == 404
    assert _post(f"{base}/v1/traces", b"", "text/plain")[0] == 415
    assert receiver.store.spans() == []


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::"])
def test_non_loopback_refused(tmp_path, host: str) -> None:
    with pytest.raises(ValueError, match="non-loopback"):
        OTLPReceiver(SpanStore(tmp_path), host=host)


def test_earlier_jsonl_store_still_read(tmp_path) -> None:
    """A directory written by an earlier version (spans.jsonl, a crash's partial last line)."""
    span = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "old", "start_ns": 1,
            "end_ns": 2}
    (tmp_path / "spans.jsonl").write_text(json.dumps(span) + "\n" + '{"span_id": "c", "na')
    store = SpanStore(tmp_path)
    new = dict(span, span_id="ef" * 8, name="new", resource={"service.name": "x"})
    store.add_spans([new])
    assert [s["name"] for s in store.spans()] == ["old", "new"]
    assert store.spans()[1] == {  # read back in the normalized shape, every key present
        **new, "parent_span_id": None, "kind": "INTERNAL", "attributes": {}, "events": [],
        "links": [], "status": {"code": "UNSET", "message": ""}}
    store.close()


def test_receiver_fast_path_stores_what_the_full_decoder_returns(tmp_path) -> None:
    """``decode_trace_rows`` (the receiver's path) and ``decode_trace_request`` (files) agree."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_ttft.tools.sink import otlp_decode

    request = encode_spans(_make_spans())
    full, fast = SpanStore(tmp_path / "full"), SpanStore(tmp_path / "fast")
    full.add_spans(otlp_decode.decode_trace_request(request))
    fast.add_span_rows(otlp_decode.decode_trace_rows(request))
    assert fast.spans() == full.spans() == otlp_decode.decode_trace_request(request)
    full.close()
    fast.close()
