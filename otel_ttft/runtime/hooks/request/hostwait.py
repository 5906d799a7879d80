"""What the host says about a worker that was not running, read by the worker at each step it
times: its major page faults (``/proc/self/stat``: memory paged back in from swap or files),
the host's steal time (``/proc/stat``: its vCPUs taken by the hypervisor) and its cgroup's CPU
throttling (``cpu.stat``: its quota ran out). Deltas since the worker's previous step are the
evidence for a step that began late (``attributes.named_waits``). A stopped or frozen process
leaves none of these: its wait is then named without a cause.

The files are opened once and read with ``pread``; one that cannot be read reads as 0 from then
on (a container without them, not Linux).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


@dataclass(frozen=True, slots=True)
class HostReading:
    """Totals since boot (faults: since the process started) at one instant."""

    major_faults: int = 0
    steal_s: float = 0.0
    throttled_s: float = 0.0


def _cgroup_cpu_stat() -> tuple[str, float] | None:
    """This process's cgroup ``cpu.stat`` and the unit of its throttled field (v2
    ``throttled_usec``, v1 ``throttled_time`` in ns)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            candidate = f"/sys/fs/cgroup{path.rstrip('/')}/cpu.stat"
            if os.path.exists(candidate) and _has(candidate, "throttled_usec"):
                return candidate, 1e-6
        if "cpu" in controllers.split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                candidate = f"/sys/fs/cgroup/{mount}{path.rstrip('/')}/cpu.stat"
                if os.path.exists(candidate):
                    return candidate, 1e-9
    return None


def _has(path: str, key: str) -> bool:
    with contextlib.suppress(OSError), open(path) as f:
        return any(line.startswith(key + " ") for line in f)
    return False


class HostClock:
    """The readings of :class:`HostReading` for this process; ``read`` costs three preads."""

    __slots__ = ("_stat", "_host", "_cgroup", "_unit", "_opened")

    def __init__(self) -> None:
        self._stat = self._host = self._cgroup = -1
        self._unit = 1e-9
        self._opened = False

    def _open(self) -> None:
        self._opened = True
        self._stat = _open("/proc/self/stat")
        self._host = _open("/proc/stat")
        found = _cgroup_cpu_stat()
        if found is not None:
            self._cgroup, self._unit = _open(found[0]), found[1]

    def read(self) -> HostReading:
        if not self._opened:
            self._open()
        faults = steal = throttled = 0.0
        if self._stat >= 0:
            with contextlib.suppress(OSError, IndexError, ValueError):
                # fields after the command name; majflt is the 12th field of the line
                faults = int(os.pread(self._stat, 1024, 0).rsplit(b")", 1)[1].split()[9])
        if self._host >= 0:
            with contextlib.suppress(OSError, IndexError, ValueError):
                steal = int(os.pread(self._host, 256, 0).split(b"\n", 1)[0].split()[8]) * _TICK_S
        if self._cgroup >= 0:
            with contextlib.suppress(OSError, ValueError):
                for line in os.pread(self._cgroup, 1024, 0).split(b"\n"):
                    key, _, value = line.partition(b" ")
                    if key in (b"throttled_usec", b"throttled_time"):
                        throttled = int(value) * self._unit
        return HostReading(int(faults), steal, throttled)

    def close(self) -> None:
        for fd in (self._stat, self._host, self._cgroup):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stat = self._host = self._cgroup = -1
        self._opened = False


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
