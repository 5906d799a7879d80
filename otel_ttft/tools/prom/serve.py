"""``otel-ttft prometheus``: a Prometheus scrape endpoint over the embedded store, or an OpenMetrics
file of its history for ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from otel_ttft.tools import foreground, safe_io
from otel_ttft.tools.prom.exposition import DEFAULT_EXPIRE_S, StoreCollector, openmetrics_history
from otel_ttft.tools.sink.db import DB_FILE, STORE_FILES, StoreFormatError
from otel_ttft.tools.sink.receiver import is_loopback
from otel_ttft.tools.sink.store_read import StoreReader


class _Guarded(StoreCollector):
    """A store that cannot be read makes the scrape fail with one line on stderr, not a
    traceback per scrape."""

    def collect(self):
        try:
            yield from list(super().collect())
        except (OSError, ValueError) as exc:
            print(f"otel-ttft prometheus: cannot read {self.store}: {exc}", file=sys.stderr)
            raise RuntimeError("store unreadable") from None


def serve(store: StoreReader, host: str, port: int, expire_s: float | None,
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
    try:
        foreground.wait_for_stop(stop)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    return 0


def main(args) -> int:
    """The CLI entry (arguments parsed and typed in ``otel_ttft.tools.cli``). Reads the store
    without creating anything in it; ``--openmetrics`` follows the output rule (``safe_io``)."""
    directory = Path(args.dir)
    store = StoreReader(directory)
    if args.openmetrics is not None:  # '' too: refused by the output rule, not served
        try:
            output = safe_io.Output(args.openmetrics, inputs=[directory], reserved=STORE_FILES)
            if not store.exists():
                raise StoreFormatError(directory, None, f"not a store: no {DB_FILE} in it")
            output.write(openmetrics_history(store.metric_points(), args.shift))
        except (safe_io.OutputError, StoreFormatError) as exc:
            print(f"otel-ttft prometheus: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.allow_non_loopback and not is_loopback(args.host):
        print(f"otel-ttft prometheus: refusing to listen on non-loopback {args.host!r} "
              "(--allow-non-loopback to do it anyway)", file=sys.stderr)
        return 2
    expire = None if args.expire <= 0 else args.expire
    try:
        return serve(store, args.host, args.port, expire)
    except (OSError, OverflowError) as exc:
        print(f"otel-ttft prometheus: {exc}", file=sys.stderr)
        return 2


DEFAULT_PORT = 9464  # the OTel Prometheus exporter's usual port
__all__ = ["DEFAULT_EXPIRE_S", "DEFAULT_PORT", "main", "serve"]
