"""An embedded OTLP receiver (HTTP and gRPC) writing into a ``SpanStore``.

The zero-infrastructure default: point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at it and every vLLM
process's spans and metrics land on local disk. It binds loopback only unless told otherwise,
because it accepts unauthenticated writes.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

from google.protobuf.message import Message

from otel_ttft.tools.sink import otlp_decode
from otel_ttft.tools.sink.otlp_http import HTTPServer, make_app
from otel_ttft.tools.sink.store import SpanStore


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_host(host: str, *, allow_non_loopback: bool = False) -> None:
    """ValueError unless ``host`` is loopback (or non-loopback is allowed): the receiver accepts
    unauthenticated writes. The CLI calls it before the store is created."""
    if not allow_non_loopback and not is_loopback(host):
        raise ValueError(
            f"refusing to bind OTLP receiver to non-loopback address {host!r}: it accepts "
            "unauthenticated writes (allow_non_loopback=True, or --allow-non-loopback, "
            "to do it anyway)"
        )


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
        check_bind_host(host, allow_non_loopback=allow_non_loopback)
        for name, port in (("http_port", http_port), ("grpc_port", grpc_port)):
            if port is not None and not (isinstance(port, int) and 0 <= port <= 65535):
                raise ValueError(f"{name} must be 0-65535, got {port!r}")
        self.store = store
        self.host = host
        self._http_port, self._grpc_port = http_port, grpc_port
        self._http: HTTPServer | None = None
        self._grpc = None
        self._grpc_bound: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> OTLPReceiver:
        """Bind and serve both; OSError (port in use, ...) leaves nothing running."""
        if self._http is not None:
            return self
        http = HTTPServer(make_app(self.ingest_traces, self.ingest_metrics), self.host,
                          self._http_port)
        self._http = http
        try:
            http.start()
            if self._grpc_port is not None:
                from otel_ttft.tools.sink.otlp_grpc import (
                    start_server,  # grpcio is heavy: on demand
                )

                host = f"[{self.host}]" if ":" in self.host else self.host
                self._grpc, self._grpc_bound = start_server(
                    f"{host}:{self._grpc_port}", self.ingest_traces, self.ingest_metrics)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop accepting, finish what is in flight, then close the store's writer."""
        if self._grpc is not None:
            self._grpc.stop(grace=2).wait(5)
            self._grpc = None
        if self._http is not None:
            self._http.stop()
            self._http = None
        self.store.close()

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- endpoints ------------------------------------------------------------------------------
    @property
    def http_port(self) -> int:
        if self._http is None:
            raise RuntimeError("receiver not started")
        return self._http.port

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
        return self.store.add_span_rows(otlp_decode.decode_trace_rows(request))

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
