"""``otel-ttft prometheus``: a Prometheus scrape endpoint over the embedded store, or an OpenMetrics
file of its history for ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from otel_ttft.prom.exposition import DEFAULT_EXPIRE_S, StoreCollector, openmetrics_history
from otel_ttft.sink.receiver import is_loopback
from otel_ttft.sink.store import SpanStore


class _Guarded(StoreCollector):
    """A store that cannot be read makes the scrape fail with one line on stderr, not a
    traceback per scrape."""

    def collect(self):
        try:
            yield from list(super().collect())
        except (OSError, ValueError) as exc:
            print(f"otel-ttft prometheus: cannot read {self.store}: {exc}", file=sys.stderr)
            raise RuntimeError("store unreadable") from None


def serve(store: SpanStore, host: str, port: int, expire_s: float | None,
          stop: threading.Event | None = None, ready: threading.Event | None = None) -> int:
    """Serve ``store`` (anything with ``metric_points()``) until ``stop`` or SIGTERM/Ctrl-C."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Guarded(store, expire_s))
    server, thread = start_http_server(port, host, registry)
    bound = server.server_address[1]
    print(f"Prometheus scrape endpoint http://{host}:{bound}/metrics ({store})", flush=True)
    if ready is not None:
        ready.port = bound  # type: ignore[attr-defined]
        ready.set()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    return 0


def main(args) -> int:
    """The CLI entry (arguments parsed in ``otel_ttft.cli``)."""
    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"otel-ttft prometheus: no store directory {directory}", file=sys.stderr)
        return 2
    if args.openmetrics:
        try:
            text = openmetrics_history(SpanStore(directory).metric_points(), args.shift)
            out = sys.stdout.buffer if args.openmetrics == "-" else open(args.openmetrics, "wb")  # noqa: SIM115
            with out:
                out.write(text)
        except (OSError, ValueError) as exc:
            print(f"otel-ttft prometheus: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.allow_non_loopback and not is_loopback(args.host):
        print(f"otel-ttft prometheus: refusing to listen on non-loopback {args.host!r} "
              "(--allow-non-loopback to do it anyway)", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"otel-ttft prometheus: port {args.port} is not in 0-65535", file=sys.stderr)
        return 2
    expire = None if args.expire <= 0 else args.expire
    try:
        return serve(SpanStore(directory), args.host, args.port, expire)
    except (OSError, OverflowError) as exc:
        print(f"otel-ttft prometheus: {exc}", file=sys.stderr)
        return 2


DEFAULT_PORT = 9464  # the OTel Prometheus exporter's usual port
__all__ = ["DEFAULT_EXPIRE_S", "DEFAULT_PORT", "main", "serve"]
