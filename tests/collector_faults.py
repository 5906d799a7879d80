"""Collectors that misbehave, on 127.0.0.1, for the failure tests and the exit benchmark.

- ``SilentCollector``: a TCP port that completes every connection and never answers (a collector
  hung in garbage collection, a proxy with a dead upstream). Exporters block until their timeout.
- ``FlappingCollector``: the real embedded receiver, up for ``up_s`` then down for ``down_s``, on
  one port, for as long as it runs.
A dead collector needs no helper: a free port with nothing listening.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from otel_ttft.tools.replay.server import HOST, free_port
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore


class SilentCollector:
    """Listens with a large backlog and never accepts: the kernel completes the handshakes."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None

    def start(self) -> SilentCollector:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((HOST, 0))
        sock.listen(1024)
        self._sock = sock
        return self

    @property
    def endpoint(self) -> str:
        assert self._sock is not None, "not started"
        return f"http://{HOST}:{self._sock.getsockname()[1]}"

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> SilentCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FlappingCollector:
    """The embedded receiver behind a TCP relay that a background thread turns on and off: while
    down, nothing listens and every open connection is closed (keep-alive included), as when a
    collector restarts."""

    def __init__(self, store_dir: Path, up_s: float = 5.0, down_s: float = 5.0) -> None:
        self.store = SpanStore(store_dir)
        self.up_s, self.down_s = up_s, down_s
        self._receiver = OTLPReceiver(self.store, HOST, 0, grpc_port=None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._port = free_port(HOST)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.cycles = 0

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self._port}"

    def start(self) -> FlappingCollector:
        self._receiver.start()
        self._thread = threading.Thread(target=self._run, name="flapping-collector", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((HOST, self._port))
                listener.listen(64)
                listener.settimeout(0.1)
            except OSError:
                listener.close()
                listener = None
            up_until = time.monotonic() + self.up_s
            while listener is not None and time.monotonic() < up_until \
                    and not self._stop.is_set():
                try:
                    client, _ = listener.accept()
                except (TimeoutError, OSError):
                    continue
                self._relay(client)
            if listener is not None:
                listener.close()
            with self._lock:
                conns, self._conns = self._conns, set()
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.cycles += 1
            self._stop.wait(self.down_s)

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((HOST, self._receiver.http_port), timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._conns.update((client, upstream))
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.up_s + self.down_s + 10)
            self._thread = None
        self._receiver.stop()

    def __enter__(self) -> FlappingCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    src.settimeout(None)
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
