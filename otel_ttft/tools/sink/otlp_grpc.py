"""OTLP/gRPC on grpcio: the trace and metrics services, with the same limits as OTLP/HTTP.

``so_reuseport`` is off, so a second sink on the same port fails to start instead of silently
taking half of the traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_ttft.tools.sink.otlp_http import MAX_BODY_BYTES
from otel_ttft.tools.sink.store import StoreUnavailable

WORKERS = 8  # decoding holds the GIL: more threads only add switching
MAX_CONCURRENT_RPCS = 1024  # beyond it: RESOURCE_EXHAUSTED
OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_BODY_BYTES),  # checked after decompression too
    ("grpc.max_connection_idle_ms", 5 * 60_000),
]


def _export(ingest: Callable[[Message], int], response: Message, request: Message,
            context: grpc.ServicerContext) -> Message:
    try:
        ingest(request)
    except StoreUnavailable as exc:  # UNAVAILABLE is retryable for OTLP exporters
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    return response


def start_server(address: str, ingest_traces: Callable[[Message], int],
                 ingest_metrics: Callable[[Message], int]) -> tuple[grpc.Server, int]:
    """A started server and its bound port; OSError when the address cannot be bound."""

    class TraceService(trace_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return _export(ingest_traces, ExportTraceServiceResponse(), request, context)

    class MetricsService(metrics_grpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            return _export(ingest_metrics, ExportMetricsServiceResponse(), request, context)

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="otlp-grpc"),
        options=OPTIONS, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    trace_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    metrics_grpc.add_MetricsServiceServicer_to_server(MetricsService(), server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio >= 1.60 raises instead of returning 0
        raise OSError(f"could not bind OTLP/gRPC to {address}: {exc}") from None
    if not port:
        raise OSError(f"could not bind OTLP/gRPC to {address} (in use?)")
    server.start()
    return server, port
