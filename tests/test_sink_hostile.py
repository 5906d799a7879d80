"""The receiver against what a broken or hostile client sends: every bad input gets a 4xx/5xx
(or a gRPC status) with a message, the receiver stays up, and every acknowledged span is stored."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import socket
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from otel_ttft.tools.sink import otlp_http
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore

TRACE = "5b8efff798038103d269b633813fc60c"


def span_json(span_id: str = "eee19b7ec3c1b174", **over: object) -> dict:
    span = {"traceId": TRACE, "spanId": span_id, "name": "s", "kind": 1,
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000"}
    span.update(over)
    return span


def request_json(*spans: dict) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def request_pb(n: int = 1, first: int = 1, trace_id: bytes = bytes.fromhex(TRACE),
               span_id: bytes | None = None, **fields: object) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    for i in range(first, first + n):
        spans.add(trace_id=trace_id, span_id=span_id if span_id is not None else
                  i.to_bytes(8, "big"), name=f"s{i}", start_time_unix_nano=1000,
                  end_time_unix_nano=2000, **fields)
    return req


@pytest.fixture(scope="module")
def rx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OTLPReceiver]:
    receiver = OTLPReceiver(SpanStore(tmp_path_factory.mktemp("hostile")))
    with receiver:
        yield receiver


def post(rx: OTLPReceiver, body: bytes, ctype: str = "application/json", path: str = "/v1/traces",
         headers: dict | None = None, method: str = "POST") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": ctype, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def error_message(ctype: str, payload: bytes) -> str:
    if ctype.startswith("application/json"):
        return json.loads(payload)["message"]
    status = status_pb2.Status()
    status.ParseFromString(payload)
    return status.message


def expect_error(rx: OTLPReceiver, status: int, needle: str, body: bytes,
                 ctype: str = "application/json", **kw: object) -> None:
    before = len(rx.store.spans())
    got, headers, payload = post(rx, body, ctype, **kw)
    assert got == status, payload[:300]
    message = error_message(headers.get("content-type", ""), payload)
    assert needle.lower() in message.lower(), message
    assert len(rx.store.spans()) == before  # nothing of a rejected batch is stored
    assert post(rx, request_json(span_json("0000000000000abc")))[0] == 200  # still serving


def deep(levels: int) -> bytes:
    """A span whose attribute value nests ``levels`` kvlists (3 JSON levels each), as text:
    too deep for json.dumps to write."""
    head = b'{"kvlistValue":{"values":[{"key":"k","value":' * levels
    tail = b"}]}}" * levels
    span = json.dumps(span_json()).encode()[:-1]
    return (b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + b',"attributes":[{"key":"a",'
            b'"value":' + head + b'{"stringValue":"x"}' + tail + b"}]}]}]}]}")


CASES = {
    "not json": (400, "invalid json", b"{not json", {}),
    "json array": (400, "expected a json object", b"[1,2]", {}),
    "short span id": (400, "spanid", request_json(span_json("abcdef12")), {}),
    "non-hex trace id": (400, "traceid", request_json(span_json(traceId="z" * 32)), {}),
    "empty span id": (400, "span_id is 0 bytes", request_json(span_json("")), {}),
    "all-zero trace id": (400, "all zero", request_json(span_json(traceId="0" * 32)), {}),
    "short parent": (400, "parentspanid", request_json(span_json(parentSpanId="ab")), {}),
    "short link id": (400, "spanid", request_json(span_json(links=[
        {"traceId": TRACE, "spanId": "12"}])), {}),
    "one bad span names it": (400, "spans[1]", request_json(
        span_json("00000000000000a1"), span_json("00000000000000a2", traceId="")), {}),
    "name is a number": (400, "otlp/json", request_json(span_json(name={"a": 1})), {}),
    "time not a number": (400, "otlp/json", request_json(span_json(startTimeUnixNano="soon")),
                          {}),
    "time past int64": (400, "2262", request_json(span_json(endTimeUnixNano=str(2**64 - 1))),
                        {}),
    "attributes not a list": (400, "otlp/json", request_json(span_json(attributes="x")), {}),
    "nested 600 deep": (400, "nested deeper", deep(200), {}),
    "nested 70 deep": (400, "nested deeper", deep(23), {}),
    "nested 100000 deep": (400, "nested", b'{"resourceSpans":' + b"[" * 100_000
                           + b"]" * 100_000 + b"}", {}),
    "bad protobuf": (400, "invalid protobuf", b"\xff\xff\xff\xff", {}, "application/x-protobuf"),
    "bad gzip": (400, "compressed", b"not gzip", {"Content-Encoding": "gzip"}),
    "truncated gzip": (400, "truncated", gzip.compress(request_json(span_json()))[:20],
                       {"Content-Encoding": "gzip"}),
    "unknown encoding": (415, "content-encoding", b"{}", {"Content-Encoding": "br"}),
    "text/plain": (415, "content-type", b"hello", {}, "text/plain"),
    "unknown route": (404, "no otlp route", b"{}", {"path": "/v1/logs"}),
    "GET": (405, "post only", b"", {"method": "GET"}),
    "content-length over limit": (413, "content-length", b"{}",
                                  {"Content-Length": str(otlp_http.MAX_BODY_BYTES + 1)}),
    "gzip bomb": (413, "inflat", gzip.compress(b"\0" * (64 << 20), 1),
                  {"Content-Encoding": "gzip"}),
    "deflate bomb": (413, "inflat", zlib.compress(b"\0" * (64 << 20), 1),
                     {"Content-Encoding": "deflate"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_http(rx: OTLPReceiver, case: str) -> None:
    status, needle, body, extra, *ctype = CASES[case]
    kw: dict = {}
    headers = {k: v for k, v in extra.items() if k not in ("path", "method")}
    if headers:
        kw["headers"] = headers
    kw.update({k: v for k, v in extra.items() if k in ("path", "method")})
    if "Content-Length" in headers:  # a lie about the length: raw socket, no body follows
        sock = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
        sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {headers['Content-Length']}\r\n\r\n".encode())
        reply = sock.recv(65536).decode(errors="replace")
        sock.close()
        assert reply.startswith(f"HTTP/1.1 {status}") and needle in reply.lower(), reply
        return
    expect_error(rx, status, needle, body, *(ctype or ["application/json"]), **kw)


def test_garbage_request_line(rx: OTLPReceiver) -> None:
    sock = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
    sock.sendall(b"\x16\x03\x01 garbage that is not HTTP\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 400")
    sock.close()
    assert post(rx, request_json(span_json("0000000000000abd")))[0] == 200


def test_chunked_body_is_stored(rx: OTLPReceiver) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
    body = request_json(span_json("00000000000c4a11", name="chunked"))
    conn.request("POST", "/v1/traces", body=iter([body[:10], body[10:]]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    assert conn.getresponse().status == 200
    conn.close()
    assert any(s["name"] == "chunked" for s in rx.store.spans())


def test_non_finite_numbers_stored_as_otlp_json_strings(rx: OTLPReceiver) -> None:
    req = request_pb(1, first=0x7A11)
    req.resource_spans[0].scope_spans[0].spans[0].attributes.extend([
        KeyValue(key="nan", value=AnyValue(double_value=float("nan"))),
        KeyValue(key="inf", value=AnyValue(double_value=float("-inf")))])
    assert post(rx, req.SerializeToString(), "application/x-protobuf")[0] == 200
    (span,) = [s for s in rx.store.spans() if s["span_id"] == f"{0x7A11:016x}"]
    assert span["attributes"] == {"nan": "NaN", "inf": "-Infinity"}
    rows = sqlite3.connect(rx.store.db_path).execute("SELECT data FROM spans").fetchall()
    for (data,) in rows:  # strict JSON: no bare NaN anywhere in the store
        json.loads(data, parse_constant=lambda c: pytest.fail(f"bare {c} stored"))


def test_idle_and_slow_clients_are_cut_off(rx: OTLPReceiver, monkeypatch) -> None:
    monkeypatch.setattr(otlp_http, "HEADER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(otlp_http, "BODY_TIMEOUT_S", 0.5)
    idle = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
    slow_headers = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
    slow_headers.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
    assert idle.recv(1) == b"" and slow_headers.recv(1) == b""  # closed by the server
    slow_body = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
    slow_body.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: 100\r\n\r\n{")
    assert slow_body.recv(4096).startswith(b"HTTP/1.1 408")
    for s in (idle, slow_headers, slow_body):
        s.close()


def test_200_concurrent_posts_all_acknowledged_and_stored(rx: OTLPReceiver) -> None:
    results: list[int] = []
    barrier = threading.Barrier(200)

    def one(i: int) -> None:
        body = request_pb(5, first=0x10000 + i * 5).SerializeToString()
        barrier.wait()
        results.append(post(rx, body, "application/x-protobuf")[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [200] * 200
    stored = {s["span_id"] for s in rx.store.spans()}
    assert {f"{i:016x}" for i in range(0x10000, 0x10000 + 1000)} <= stored


def _grpc_export(rx: OTLPReceiver, request: ExportTraceServiceRequest) -> grpc.RpcError | None:
    with grpc.insecure_channel(rx.grpc_endpoint.removeprefix("http://")) as channel:
        try:
            trace_grpc.TraceServiceStub(channel).Export(request, timeout=30)
        except grpc.RpcError as exc:
            return exc
    return None


@pytest.mark.parametrize("fields, code, needle", [
    ({"trace_id": b"\1" * 4}, grpc.StatusCode.INVALID_ARGUMENT, "trace_id is 4 bytes"),
    ({"span_id": b""}, grpc.StatusCode.INVALID_ARGUMENT, "span_id is 0 bytes"),
    ({"parent_span_id": b"\1"}, grpc.StatusCode.INVALID_ARGUMENT, "parent_span_id"),
    ({"end_time_unix_nano": 2**64 - 1}, grpc.StatusCode.INVALID_ARGUMENT, "2262"),
])
def test_hostile_grpc(rx: OTLPReceiver, fields: dict, code: grpc.StatusCode, needle: str) -> None:
    req = request_pb(1, first=0x6000)
    span = req.resource_spans[0].scope_spans[0].spans[0]
    for key, value in fields.items():
        setattr(span, key, value)
    error = _grpc_export(rx, req)
    assert error is not None and error.code() == code and needle in error.details()
    assert _grpc_export(rx, request_pb(1, first=0x6001)) is None  # still serving
    assert not any(s["span_id"] == f"{0x6000:016x}" for s in rx.store.spans())


def test_grpc_oversized_message(rx: OTLPReceiver) -> None:
    req = request_pb(1, first=0x6100)
    req.resource_spans[0].scope_spans[0].spans[0].attributes.add(
        key="big", value=AnyValue(string_value="x" * (otlp_http.MAX_BODY_BYTES + 10)))
    error = _grpc_export(rx, req)
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _grpc_export(rx, request_pb(1, first=0x6101)) is None


def test_second_receiver_cannot_share_the_grpc_port(rx: OTLPReceiver, tmp_path: Path) -> None:
    port = int(rx.grpc_endpoint.rsplit(":", 1)[1])
    other = OTLPReceiver(SpanStore(tmp_path), grpc_port=port)
    with pytest.raises(OSError, match="could not bind"):
        other.start()
    http_port = rx.http_port
    with pytest.raises(OSError):
        OTLPReceiver(SpanStore(tmp_path), http_port=http_port, grpc_port=None).start()


@pytest.mark.parametrize("port", [-1, 65536, 99999, "80"])
def test_port_out_of_range_refused(tmp_path: Path, port: object) -> None:
    with pytest.raises(ValueError, match="0-65535"):
        OTLPReceiver(SpanStore(tmp_path), http_port=port)  # type: ignore[arg-type]


def test_json_ids_are_hex_not_base64(rx: OTLPReceiver) -> None:
    """``abcdef12`` used to be decoded as base64 into a 6-byte id; now a 16-hex-digit id is
    required, and a valid one round-trips exactly."""
    assert post(rx, request_json(span_json("abcdef1234567890", name="hexid")))[0] == 200
    (span,) = [s for s in rx.store.spans() if s["name"] == "hexid"]
    assert span["span_id"] == "abcdef1234567890" and span["trace_id"] == TRACE
    b64 = base64.b64encode(bytes.fromhex("abcdef1234567890")).decode()
    assert post(rx, request_json(span_json(b64)))[0] == 400


def test_store_readable_while_receiving(rx: OTLPReceiver) -> None:
    """A reader (tree/analyze) runs while exporters write: WAL, no 'database is locked'."""
    stop = threading.Event()

    def write() -> None:
        i = 0x900000
        while not stop.is_set():
            post(rx, request_pb(50, first=i).SerializeToString(), "application/x-protobuf")
            i += 50

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + 2
        reads = 0
        while time.monotonic() < deadline:
            assert isinstance(rx.store.spans(), list)
            reads += 1
    finally:
        stop.set()
        writer.join(30)
    assert reads >= 2
