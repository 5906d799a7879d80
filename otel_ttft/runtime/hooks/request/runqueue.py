"""How long the calling thread has waited on the kernel's run queue, runnable and not running
(``run_delay``, the second field of ``/proc/thread-self/schedstat``; ``None`` where the kernel has
no schedstats). A wait for a CPU shows here wherever in a step it falls, and also for a thread
that spins while it waits (OpenMP's barrier), which the wall-against-CPU reading misses. A
worker woken through ZeroMQ waits for its I/O thread (``ZMQbg/IO/N``) first: its clock
(``with_io_threads``) adds those threads' delay.
"""

from __future__ import annotations

import contextlib
import os
import threading

_PATH = "/proc/thread-self/schedstat"


_IO_THREAD = "ZMQbg/IO/"


class RunQueueClock:
    """The run-queue delay of the thread that reads it (and, ``with_io_threads``, of its
    process's ZeroMQ I/O threads); the files are opened once per reading thread."""

    __slots__ = ("_fds", "_thread", "_broken", "_io")

    def __init__(self, *, with_io_threads: bool = False) -> None:
        self._fds: list[int] = []
        self._thread: int | None = None
        self._broken = False
        self._io = with_io_threads

    def seconds(self) -> float | None:
        """Seconds these threads have waited on the run queue since they started, or
        ``None``."""
        if self._broken:
            return None
        try:
            if self._thread != threading.get_ident():
                self._reopen()
            return sum(int(os.pread(fd, 96, 0).split()[1]) for fd in self._fds) / 1e9
        except (OSError, IndexError, ValueError, TypeError):
            self._broken = True
            self.close()
            return None

    def _reopen(self) -> None:
        self.close()
        self._thread = threading.get_ident()
        self._fds.append(os.open(_PATH, os.O_RDONLY | os.O_CLOEXEC))
        if self._io:
            self._fds += [os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                          for tid in _io_threads()]

    def close(self) -> None:
        fds, self._fds, self._thread = self._fds, [], None
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _io_threads() -> list[str]:
    """This process's ZeroMQ I/O threads, by the name libzmq gives them (at most 8)."""
    found = []
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(_IO_THREAD):
                    found.append(tid)
    return found[:8]
