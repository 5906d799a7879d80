"""The embedded receiver in a process of its own, for the tools that also time requests (``demo``,
``verify``): in the process whose threads time a replay's requests, the receiver's decoding of a
burst of spans takes the GIL from them, and a first chunk read late is a client TTFT (and a
``network`` stage) too long. Measured here: six concurrent streamed requests against one vLLM,
with the receiver in the client's process two of them read their whole response 0.6 s late in
one go; in a process of its own, none.

The child is ``otel-ttft sink`` on a free loopback port, OTLP/HTTP only; the parent reads the
same store (SQLite in WAL mode) through its own :class:`~otel_ttft.tools.sink.store.SpanStore`.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

from otel_ttft.tools.sink.store import SpanStore

_ENDPOINT_PREFIX = "OTLP/HTTP"


class ReceiverStartError(RuntimeError):
    """The receiver process exited or said nothing in time; the message says what it printed."""


class ReceiverProcess:
    """``with ReceiverProcess(directory) as receiver:`` ``receiver.http_endpoint`` takes OTLP,
    ``receiver.store`` reads what arrived. Leaving the block stops the child (SIGTERM: it
    flushes what it acknowledged), then kills it if it has not gone within ``stop_timeout_s``."""

    def __init__(self, directory: str | os.PathLike[str], host: str = "127.0.0.1",
                 start_timeout_s: float = 60.0, stop_timeout_s: float = 15.0) -> None:
        self.store = SpanStore(directory)  # creates the schema: the parent may read first
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.http_endpoint: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._drainer: threading.Thread | None = None

    def start(self) -> ReceiverProcess:
        argv = [sys.executable, "-m", "otel_ttft.tools.cli", "sink", "--dir",
                str(Path(self.store.directory).resolve()), "--host", self.host,
                "--http-port", "0", "--grpc-port", "-1"]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        said: list[str] = []
        try:
            self.http_endpoint = self._read_endpoint(said)
        except BaseException:
            self.stop()
            raise
        # Whatever it prints later is read and dropped, so that it never blocks on a full pipe.
        self._drainer = threading.Thread(target=self._drain, args=(self._proc,),
                                         name="otel-ttft-sink-output", daemon=True)
        self._drainer.start()
        return self

    def _read_endpoint(self, said: list[str]) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=min(0.5, max(deadline - time.monotonic(), 0))):
                    continue
                line = self._proc.stdout.readline()
                if not line:  # it exited
                    break
                said.append(line.rstrip())
                if line.startswith(_ENDPOINT_PREFIX):
                    return line.split()[1]
        status = self._proc.poll()
        what = f"exited {status}" if status is not None else "did not start in time"
        tail = " | ".join(said[-5:]) or "nothing"
        raise ReceiverStartError(f"the OTLP receiver process {what}; it said: {tail}")

    @staticmethod
    def _drain(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for _ in proc.stdout:
                pass

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.join(5)  # it closes the pipe at the end of the output
        elif proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> ReceiverProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
