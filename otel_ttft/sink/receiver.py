"""An embedded OTLP receiver (HTTP and gRPC) writing into a ``SpanStore``.

The zero-infrastructure default: point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at it and every vLLM
process's spans and metrics land on local disk. It binds loopback only unless told otherwise,
because it accepts unauthenticated writes.
"""

from __future__ import annotations

import gzip
import ipaddress
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_ttft.sink import otlp_decode
from otel_ttft.sink.store import SpanStore

try:  # google.rpc.Status is the documented OTLP/HTTP error body; plain text if absent.
    from google.rpc import status_pb2
except ImportError:  # pragma: no cover
    status_pb2 = None

MAX_BODY_BYTES = 64 << 20
_JSON, _PROTOBUF = "application/json", "application/x-protobuf"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class OTLPReceiver:
    """OTLP/HTTP (``/v1/traces``, ``/v1/metrics``) and OTLP/gRPC, both into one store.

    Port 0 picks a free port; ``grpc_port=None`` disables gRPC.
    """

    def __init__(
        self,
        store: SpanStore,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int | None = 0,
        *,
        allow_non_loopback: bool = False,
    ) -> None:
        if not allow_non_loopback and not is_loopback(host):
            raise ValueError(
                f"refusing to bind OTLP receiver to non-loopback address {host!r}: it accepts "
                "unauthenticated writes (allow_non_loopback=True, or --allow-non-loopback, "
                "to do it anyway)"
            )
        self.store = store
        self.host = host
        self._http_port, self._grpc_port = http_port, grpc_port
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc = None
        self._grpc_bound: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> OTLPReceiver:
        if self._http is not None:
            return self
        server_cls = _IPv6Server if ":" in self.host else _Server
        self._http = server_cls((self.host, self._http_port), _make_handler(self))
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, name="otlp-http", daemon=True
        )
        self._http_thread.start()
        if self._grpc_port is not None:
            try:
                self._start_grpc()
            except Exception:
                self.stop()
                raise
        return self

    def _start_grpc(self) -> None:
        import grpc  # deferred: heavy, and HTTP-only users do not need it

        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"),
            options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)],
        )
        _add_grpc_services(self._grpc, self)
        address = f"[{self.host}]:{self._grpc_port}" if ":" in self.host else \
            f"{self.host}:{self._grpc_port}"
        self._grpc_bound = self._grpc.add_insecure_port(address)
        if not self._grpc_bound:
            raise OSError(f"could not bind OTLP/gRPC to {address}")
        self._grpc.start()

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(5)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join(5)
            self._http_thread = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- endpoints ------------------------------------------------------------------------------
    @property
    def http_port(self) -> int:
        if self._http is None:
            raise RuntimeError("receiver not started")
        return self._http.server_address[1]

    @property
    def http_endpoint(self) -> str:
        """Base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/...``)."""
        return _url(self.host, self.http_port)

    @property
    def grpc_endpoint(self) -> str:
        if self._grpc_bound is None:
            raise RuntimeError("gRPC is not running (grpc_port=None or not started)")
        return _url(self.host, self._grpc_bound)

    # --- ingestion (shared by HTTP and gRPC) ----------------------------------------------------
    def ingest_traces(self, request: Message) -> int:
        return self.store.add_spans(otlp_decode.decode_trace_request(request))

    def ingest_metrics(self, request: Message) -> int:
        return self.store.add_metric_points(otlp_decode.decode_metrics_request(request))

    def wait_for_spans(
        self, predicate: Callable[[list[dict]], object], timeout: float = 30.0,
        interval: float = 0.1,
    ) -> list[dict]:
        """Poll the store until ``predicate(all spans)`` is truthy; returns all spans.

        Raises TimeoutError naming what did arrive, so a failing test says why.
        """
        deadline = time.monotonic() + timeout
        while True:
            spans = self.store.spans()
            if predicate(spans):
                return spans
            if time.monotonic() >= deadline:
                names = sorted({s.get("name", "?") for s in spans})
                raise TimeoutError(
                    f"spans did not satisfy the predicate within {timeout:g} s; "
                    f"{len(spans)} received: {', '.join(names[:30]) or 'none'}"
                )
            time.sleep(interval)


# --- OTLP/HTTP ----------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _make_handler(receiver: OTLPReceiver) -> type[BaseHTTPRequestHandler]:
    routes = {
        "/v1/traces": (otlp_decode.trace_request_from_body, receiver.ingest_traces,
                       ExportTraceServiceResponse),
        "/v1/metrics": (otlp_decode.metrics_request_from_body, receiver.ingest_metrics,
                        ExportMetricsServiceResponse),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "otel-ttft-sink"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # exporters retry on errors; the response code tells them what they need

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            route = routes.get(path)
            ctype = self.headers.get("Content-Type", _PROTOBUF).split(";")[0].strip().lower()
            is_json = ctype == _JSON
            if route is None:
                self._drain()
                return self._error(HTTPStatus.NOT_FOUND, f"no OTLP route {path}", is_json)
            if ctype not in (_JSON, _PROTOBUF):
                self._drain()
                return self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                                   f"unsupported Content-Type {ctype!r}", False)
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   "missing or oversized Content-Length", is_json)
            body = self.rfile.read(length)
            parse, ingest, response_cls = route
            try:
                body = _decompress(body, self.headers.get("Content-Encoding", ""))
                request = parse(body, is_json=is_json)
            except (ValueError, OSError, EOFError, zlib.error) as exc:
                return self._error(HTTPStatus.BAD_REQUEST, str(exc), is_json)
            try:
                ingest(request)
            except OSError as exc:  # disk full etc.: retryable for the exporter
                return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"store: {exc}", is_json)
            self._send(HTTPStatus.OK, response_cls(), is_json)

        def do_GET(self) -> None:  # noqa: N802
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "OTLP endpoints accept POST only", False)

        def _drain(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = 0
            if 0 < length <= MAX_BODY_BYTES:
                self.rfile.read(length)
            elif length:
                self.close_connection = True

        def _error(self, status: HTTPStatus, message: str, is_json: bool) -> None:
            if status_pb2 is not None:
                body = status_pb2.Status(code=_grpc_code(status), message=message)
                return self._send(status, body, is_json)
            self._write(status, message.encode(), "text/plain; charset=utf-8")

        def _send(self, status: HTTPStatus, message: Message, is_json: bool) -> None:
            if is_json:
                from google.protobuf import json_format

                payload = json_format.MessageToJson(message, indent=None).encode()
                self._write(status, payload, _JSON)
            else:
                self._write(status, message.SerializeToString(), _PROTOBUF)

        def _write(self, status: HTTPStatus, payload: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def _grpc_code(status: HTTPStatus) -> int:
    """google.rpc.Code for the HTTP status (INVALID_ARGUMENT, UNAVAILABLE, ...)."""
    return {400: 3, 404: 5, 405: 12, 413: 8, 415: 3, 503: 14}.get(int(status), 2)


# --- OTLP/gRPC ----------------------------------------------------------------------------------
def _add_grpc_services(server: object, receiver: OTLPReceiver) -> None:
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc

    def export(ingest: Callable[[Message], int], response: Message,
               request: Message, context: grpc.ServicerContext) -> Message:
        try:
            ingest(request)
        except OSError as exc:  # UNAVAILABLE is retryable for OTLP exporters
            context.abort(grpc.StatusCode.UNAVAILABLE, f"store: {exc}")
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return response

    class TraceService(trace_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return export(receiver.ingest_traces, ExportTraceServiceResponse(), request, context)

    class MetricsService(metrics_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return export(receiver.ingest_metrics, ExportMetricsServiceResponse(), request,
                          context)

    trace_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    metrics_grpc.add_MetricsServiceServicer_to_server(MetricsService(), server)
