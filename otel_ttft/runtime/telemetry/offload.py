"""The API server's spans are OTLP-encoded and sent by a process of their own.

vLLM's API server is one Python process, and at peak it is the first thing a GPU server runs out
of. The SDK's OTLP span exporter encodes every span in pure Python (about 0.1 ms for a request
span's 30 attributes) and sends it, on the batch processor's thread, holding the GIL the event
loop needs. Here the batch processor stays as the user configured it (queue, batch size, delay),
but its exporter hands each batch, as compact msgpack (``span_wire``), through a pipe to a child
process (``offload_sidecar``) that rebuilds the spans and exports them with the same exporter
class, built from the same ``OTEL_EXPORTER_OTLP_*`` settings -- the way a Collector sidecar
would, with nothing to deploy.

The child's result is the batch's result: ``export`` waits (off the event loop, in the batch
processor's thread, without the GIL) for the child to say whether the exporter delivered it, so
failures are counted exactly as before (``bounded_export``). If the child cannot start, dies or
stops answering, that batch and every later one are exported in this process as before (a batch
the child may already have sent can then arrive twice; none is lost), logged once.

Applied to the SDK's OTLP/HTTP and OTLP/gRPC span exporters of the provider in force, in the API
server only, when the exporter is the one the environment describes (a fresh one built from it
sends to the same endpoint); ``OTEL_TTFT_EXPORT_OFFLOAD=false`` keeps every export in process.
Metrics stay in process: one export a minute.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from otel_ttft.runtime import config
from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.telemetry import sdk_internals, span_wire
from otel_ttft.semconv import PROCESS_API_SERVER

logger = logging.getLogger("otel_ttft")

# The exporter classes the child can rebuild from the environment alone.
ELIGIBLE = {
    "opentelemetry.exporter.otlp.proto.http.trace_exporter:OTLPSpanExporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter:OTLPSpanExporter",
}
SIDECAR_MODULE = "otel_ttft.runtime.telemetry.offload_sidecar"
_HEADER = struct.Struct("!I")
_ANSWER_GRACE_S = 5.0  # beyond the exporter's own timeout (its retries are bounded by it)


def class_path(exporter: Any) -> str:
    return f"{type(exporter).__module__}:{type(exporter).__qualname__}"


def eligible(exporter: Any) -> bool:
    """An exporter the child can rebuild: one of ``ELIGIBLE``, sending where a fresh one built
    from this environment would (so it was not given another endpoint in code)."""
    if class_path(exporter) not in ELIGIBLE:
        return False
    try:
        fresh = type(exporter)()
    except Exception:  # noqa: BLE001 - cannot build one from the environment: keep it here
        return False
    try:
        return sdk_internals.exporter_endpoint(fresh) == sdk_internals.exporter_endpoint(exporter)
    finally:
        with contextlib.suppress(Exception):
            fresh.shutdown()


class OffloadedSpanExporter:
    """Stands in for an OTLP span exporter; see the module docstring. Everything but ``export``,
    ``shutdown`` and ``force_flush`` is the inner exporter's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one batch in the pipe at a time
        self._broken = False
        self._shutdown = False
        self._timeout_s = float(getattr(inner, "_timeout", 10) or 10) + _ANSWER_GRACE_S

    @property
    def takes_wire_spans(self) -> bool:
        """Whether spans may reach ``export`` encoded already (``span_wire.WireSpan``): the
        batches go to the child (an export here turns them back into ``ReadableSpan``)."""
        return not self._broken and not self._shutdown and \
            this_process.kind == PROCESS_API_SERVER

    @property
    def sidecar_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def export(self, spans: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if not self._broken and not self._shutdown and this_process.kind == PROCESS_API_SERVER:
            with self._lock:
                try:
                    return self._via_child(spans)
                except Exception as exc:  # noqa: BLE001 - the child failed: export here
                    if self._shutdown:
                        return _failure()
                    self._give_up(exc)
        return self._inner.export(span_wire.readable(spans), *args, **kwargs)

    def _via_child(self, spans: Sequence[Any]) -> Any:
        proc = self._proc or self._start()
        payload = span_wire.encode(spans)
        deadline = time.monotonic() + self._timeout_s
        _write_all(proc.stdin.fileno(), _HEADER.pack(len(payload)) + payload, deadline)
        answer = _read_byte(proc.stdout.fileno(), deadline)
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS if answer == b"1" else SpanExportResult.FAILURE

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        # The child must not be instrumented itself (opentelemetry-instrument's sitecustomize).
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                 if p and "auto_instrumentation" not in p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", SIDECAR_MODULE, class_path(self._inner)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        os.set_blocking(self._proc.stdin.fileno(), False)
        return self._proc

    def _give_up(self, exc: BaseException) -> None:
        self._broken = True
        logger.warning("otel-ttft: the span export process failed (%r); spans are exported in "
                       "this process from now on", exc)
        self._stop_child(0.0)

    def _stop_child(self, wait_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()  # EOF: it exports what it has, then exits
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
        with contextlib.suppress(OSError):
            proc.stdout.close()

    def shutdown(self, *args: Any, **kwargs: Any) -> Any:
        self._shutdown = True
        self._stop_child(1.0)
        return self._inner.shutdown(*args, **kwargs)

    def force_flush(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.force_flush(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _failure() -> Any:
    from opentelemetry.sdk.trace.export import SpanExportResult

    return SpanExportResult.FAILURE


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("span export process not reading")
        _, ready, _ = select.select([], [fd], [], left)
        if ready:
            view = view[os.write(fd, view):]


def _read_byte(fd: int, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    ready, _, _ = select.select([fd], [], [], max(0.0, left))
    if not ready:
        raise TimeoutError("span export process not answering")
    answer = os.read(fd, 1)
    if not answer:
        raise EOFError("span export process exited")
    return answer


def maybe_offload(exporter: Any) -> Any:
    """``exporter`` behind an ``OffloadedSpanExporter`` when it is eligible and offload is on."""
    if not config.current.export_offload or isinstance(exporter, OffloadedSpanExporter):
        return exporter
    return OffloadedSpanExporter(exporter) if eligible(exporter) else exporter
