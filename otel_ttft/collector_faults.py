"""Collectors that misbehave, on 127.0.0.1, for the failure tests and the exit benchmark.

- ``SilentCollector``: a TCP port that completes every connection and never answers (a collector
  hung in garbage collection, a proxy with a dead upstream). Exporters block until their timeout.
- ``FlappingCollector``: the real embedded receiver, up for ``up_s`` then down for ``down_s``, on
  one port, for as long as it runs.
A dead collector needs no helper: a free port with nothing listening.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import SpanStore

HOST = "127.0.0.1"


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
    """The embedded receiver, toggled up and down on a fixed port by a background thread."""

    def __init__(self, store_dir: Path, up_s: float = 5.0, down_s: float = 5.0) -> None:
        self.store = SpanStore(store_dir)
        self.up_s, self.down_s = up_s, down_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._port = _free_port()
        self.cycles = 0

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self._port}"

    def start(self) -> FlappingCollector:
        self._thread = threading.Thread(target=self._run, name="flapping-collector", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            receiver = OTLPReceiver(self.store, HOST, self._port, grpc_port=None)
            try:
                receiver.start()
            except OSError:  # port still in TIME_WAIT or taken: count it as a down period
                receiver = None
            self._stop.wait(self.up_s)
            if receiver is not None:
                receiver.stop()
            self.cycles += 1
            self._stop.wait(self.down_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.up_s + self.down_s + 10)
            self._thread = None

    def __enter__(self) -> FlappingCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
