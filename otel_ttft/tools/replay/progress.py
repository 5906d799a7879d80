"""Progress on long steps (server starts, switches): a rich spinner on a terminal, plain
timestamped lines otherwise (CI logs, pipes), so a slow step is never mistaken for a hang."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None):
        self.stream = stream or sys.stderr
        self._t0 = time.monotonic()
        self._console = None
        if live is None:
            live = bool(getattr(self.stream, "isatty", lambda: False)())
        if live:
            try:
                from rich.console import Console  # a vLLM dependency; optional for us
            except ImportError:
                pass
            else:
                self._console = Console(file=self.stream)

    def line(self, message: str) -> None:
        print(f"[{time.monotonic() - self._t0:7.1f}s] {message}", file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, message: str) -> Iterator[None]:
        start = time.monotonic()
        if self._console is not None:
            with self._console.status(message):
                yield
        else:
            self.line(f"{message} ...")
            yield
        self.line(f"{message}: {time.monotonic() - start:.1f} s")
