"""How long the calling thread has waited on the kernel's run queue: runnable, not running
(``run_delay``, the second field of ``/proc/thread-self/schedstat``).

EngineCore's thread reads it around each step while some request waits for its first token. A
thread that waits for a CPU there (another process on its core, as two vLLM servers bound to the
same CPU are) loses that time wherever in the step it falls, including outside the worker's
``execute_model``, and a thread that spins while it waits for another (OpenMP's barrier) is still
on the CPU: neither shows as the worker's wall time against its CPU time, both show here. A
stopped process is not on the run queue: that is the worker's wall-against-CPU reading.
Where the file is absent (no schedstats in the kernel, not Linux) the clock reads ``None``.
"""

from __future__ import annotations

import contextlib
import os
import threading

_PATH = "/proc/thread-self/schedstat"


class RunQueueClock:
    """The run-queue delay of the thread that reads it; the file is opened once per thread."""

    __slots__ = ("_fd", "_thread", "_broken")

    def __init__(self) -> None:
        self._fd: int | None = None
        self._thread: int | None = None
        self._broken = False

    def seconds(self) -> float | None:
        """Seconds this thread has waited on the run queue since it started, or ``None``."""
        if self._broken:
            return None
        try:
            if self._thread != threading.get_ident():
                self._reopen()
            fields = os.pread(self._fd, 96, 0).split()
            return int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError, TypeError):
            self._broken = True
            self.close()
            return None

    def _reopen(self) -> None:
        self.close()
        self._fd = os.open(_PATH, os.O_RDONLY | os.O_CLOEXEC)
        self._thread = threading.get_ident()

    def close(self) -> None:
        fd, self._fd, self._thread = self._fd, None, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
