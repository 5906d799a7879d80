"""The API server's span export process (``offload``): ``python -m
otel_ttft.runtime.telemetry.offload_sidecar MODULE:CLASS``.

Reads length-prefixed batches (``span_wire``) on stdin, exports each with one exporter of that
class built from the environment (``OTEL_EXPORTER_OTLP_*``, as the parent's was), and answers one
byte per batch on stdout: ``1`` delivered, ``0`` not. It outlives a SIGINT or SIGTERM sent to
the server's process group, so the server's final flush still goes out through it, and exits at
end of input (the server closed the pipe, or is gone), after shutting its exporter down.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import struct
import sys

from otel_ttft.runtime.telemetry import offload, span_wire

_HEADER = struct.Struct("!I")
_MAX_BATCH = 256 * 1024 * 1024
_PARENT_CHECK_S = 1.0


def _read_exact(fd: int, n: int, parent: int) -> bytes | None:
    """``n`` bytes, or None at end of input (or once the parent is gone)."""
    chunks, left = [], n
    while left:
        ready, _, _ = select.select([fd], [], [], _PARENT_CHECK_S)
        if not ready:
            if os.getppid() != parent:
                return None
            continue
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in offload.ELIGIBLE:
        print("usage: offload_sidecar MODULE:CLASS (an OTLP span exporter)", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    module, _, name = argv[0].partition(":")
    exporter = getattr(importlib.import_module(module), name)()
    from opentelemetry.sdk.trace.export import SpanExportResult

    parent = os.getppid()
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    try:
        while True:
            head = _read_exact(fd_in, _HEADER.size, parent)
            if head is None:
                return 0
            (size,) = _HEADER.unpack(head)
            if size > _MAX_BATCH:
                return 2
            data = _read_exact(fd_in, size, parent)
            if data is None:
                return 0
            try:
                ok = exporter.export(span_wire.decode(data)) is SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - the SDK's exporters log their own failures
                ok = False
            try:
                os.write(fd_out, b"1" if ok else b"0")
            except OSError:  # the server is gone
                return 0
    finally:
        with contextlib.suppress(Exception):
            exporter.shutdown()


if __name__ == "__main__":
    sys.exit(main())
