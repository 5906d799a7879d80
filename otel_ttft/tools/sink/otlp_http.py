"""OTLP/HTTP on uvicorn + starlette (both already in vLLM's dependency set).

uvicorn gives keep-alive, chunked bodies, a real listen backlog and a bound on concurrent
connections; what is ours is the OTLP part: body and decompressed-size limits checked while
reading and inflating, OTLP's error body (``google.rpc.Status``) on every error, and 503 with
``Retry-After`` when the store cannot commit, which exporters retry.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
import zlib
from collections.abc import Awaitable, Callable

import uvicorn
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_ttft.tools.sink import otlp_decode
from otel_ttft.tools.sink.store import StoreUnavailable

try:  # google.rpc.Status is the documented OTLP/HTTP error body; plain text if absent.
    from google.rpc import status_pb2
except ImportError:  # pragma: no cover
    status_pb2 = None

MAX_BODY_BYTES = 16 << 20  # on the wire and after inflating: a bigger batch is a 413
BODY_TIMEOUT_S = 30.0  # to receive a whole body once its headers are in
HEADER_TIMEOUT_S = 15.0  # an idle or slow-to-send-headers connection is closed after this
MAX_CONNECTIONS = 1024  # beyond it uvicorn answers 503
BACKLOG = 2048
_JSON, _PROTOBUF = "application/json", "application/x-protobuf"


class _PayloadError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Inflater:
    """Incremental gzip/deflate with the output bounded as it is produced: a 1 MB bomb costs
    16 MB of memory and a few milliseconds, not gigabytes."""

    def __init__(self, encoding: str, limit: int) -> None:
        encoding = encoding.strip().lower()
        self.limit, self.size, self.parts = limit, 0, []
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
        else:
            raise _PayloadError(415, f"unsupported Content-Encoding {encoding!r}")

    def feed(self, chunk: bytes) -> None:
        if self._z is None:
            self._add(chunk)
            return
        if self._z.eof:
            if chunk:
                raise _PayloadError(400, "data after the end of the compressed body")
            return
        try:
            out = self._z.decompress(chunk, self.limit - self.size + 1)
        except zlib.error as exc:
            raise _PayloadError(400, f"bad compressed body: {exc}") from None
        self._add(out)
        if self._z.unconsumed_tail:
            raise _PayloadError(413, f"body inflates beyond {self.limit} bytes")

    def _add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise _PayloadError(413, f"body over {self.limit} bytes (after inflating)")
        self.parts.append(data)

    def result(self) -> bytes:
        if self._z is not None and not self._z.eof:
            raise _PayloadError(400, "truncated compressed body")
        return b"".join(self.parts)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise _PayloadError(413, f"Content-Length over {limit} bytes")
    inflater = _Inflater(request.headers.get("content-encoding", ""), limit)
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _PayloadError(413, f"body over {limit} bytes")
        inflater.feed(chunk)
    return inflater.result()


def _status_body(status: int, message: str, is_json: bool) -> Response:
    code = {400: 3, 404: 5, 405: 12, 408: 4, 413: 8, 415: 3, 503: 14}.get(status, 2)
    headers = {"Retry-After": "1"} if status == 503 else None
    if status_pb2 is None:  # pragma: no cover
        return Response(message, status, headers, media_type="text/plain")
    return _message(status_pb2.Status(code=code, message=message), is_json, status, headers)


def _message(message: Message, is_json: bool, status: int = 200,
             headers: dict[str, str] | None = None) -> Response:
    if is_json:
        body = json_format.MessageToJson(message, indent=None)
        return Response(body, status, headers, media_type=_JSON)
    return Response(message.SerializeToString(), status, headers, media_type=_PROTOBUF)


def make_app(ingest_traces: Callable[[Message], int],
             ingest_metrics: Callable[[Message], int]) -> Starlette:
    """The ASGI app: ``POST /v1/traces`` and ``POST /v1/metrics``."""

    def endpoint(parse: Callable[..., Message], ingest: Callable[[Message], int],
                 response: Message) -> Callable[[Request], Awaitable[Response]]:
        def work(body: bytes, is_json: bool) -> None:  # in a worker thread: CPU and commit
            ingest(parse(body, is_json=is_json))

        async def handle(request: Request) -> Response:
            ctype = request.headers.get("content-type", _PROTOBUF).split(";")[0].strip().lower()
            is_json = ctype == _JSON
            if ctype not in (_JSON, _PROTOBUF):
                return _status_body(415, f"unsupported Content-Type {ctype!r}", False)
            try:
                body = await asyncio.wait_for(_read_body(request, MAX_BODY_BYTES),
                                              BODY_TIMEOUT_S)
                await run_in_threadpool(work, body, is_json)
            except _PayloadError as exc:
                return _status_body(exc.status, str(exc), is_json)
            except asyncio.TimeoutError:
                return _status_body(408, f"body not received within {BODY_TIMEOUT_S:g} s",
                                    is_json)
            except ClientDisconnect:
                return Response(status_code=400)  # nobody is listening; nothing was stored
            except StoreUnavailable as exc:
                return _status_body(503, str(exc), is_json)
            except ValueError as exc:  # OTLPDecodeError and the store's own checks
                return _status_body(400, str(exc), is_json)
            return _message(response, is_json)

        return handle

    routes = [
        Route("/v1/traces", endpoint(otlp_decode.trace_request_from_body, ingest_traces,
                                     ExportTraceServiceResponse()), methods=["POST"]),
        Route("/v1/metrics", endpoint(otlp_decode.metrics_request_from_body, ingest_metrics,
                                      ExportMetricsServiceResponse()), methods=["POST"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _status_body(404, f"no OTLP route {request.url.path}", False)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _status_body(405, "OTLP endpoints accept POST only", False)

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})


class _Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus one timer it lacks: a connection that sends no complete
    request headers within ``HEADER_TIMEOUT_S`` (idle from the start, or a slowloris) is
    closed, so idle clients cannot hold descriptors forever."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and not self.transport.is_closing():
            self.transport.close()


class _ListenSocket(socket.socket):
    """The listening socket, with one fix to asyncio's accept loop: out of descriptors, asyncio
    logs, pauses accepting for a second, and then keeps calling ``accept`` up to ``backlog``
    times in the same tick, logging and scheduling a retry each time (thousands per second at
    a backlog of 2,048: a spin). After one EMFILE, further calls in that burst report "nothing
    to accept", so the pause is one log line and one retry per second."""

    _out_of_descriptors_at = -1.0

    def accept(self):  # type: ignore[override]
        if time.monotonic() - self._out_of_descriptors_at < 0.5:
            raise BlockingIOError(errno.EAGAIN, "pausing: out of file descriptors")
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._out_of_descriptors_at = time.monotonic()
            raise


class HTTPServer:
    """uvicorn serving the app on its own thread and event loop, on a socket bound here so that
    port 0 works and a bind error is raised to the caller."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = _ListenSocket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        config = uvicorn.Config(
            app, lifespan="off", http=_Protocol, loop="asyncio", log_level="error",
            access_log=False, backlog=BACKLOG, limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=int(HEADER_TIMEOUT_S), timeout_graceful_shutdown=5,
            h11_max_incomplete_event_size=64 << 10)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="otlp-http", daemon=True)
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not self.server.started:
            if not self._thread.is_alive():
                raise OSError(f"OTLP/HTTP server did not start: {self._error}")
            if waited >= timeout_s:
                raise OSError("OTLP/HTTP server did not start in time")
            deadline.wait(0.01)
            waited += 0.01

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
        self.sock.close()
