"""What the benchmarks read off a running vLLM server from outside, the same way for every arm:
its processes by role, CPU-seconds (whole process and per thread, from ``/proc``), the event-loop
thread's context switches (how often it slept and woke), syscalls and bytes through read/write
(sockets included: the ZMQ traffic between the API server and EngineCore), minor page faults,
and pausing it (SIGSTOP to its process group) while another arm is measured."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from otel_ttft.tools.replay.server import VllmServer

_TICK = os.sysconf("SC_CLK_TCK")


def pause(server: VllmServer, paused: bool) -> None:
    """An idle vLLM still polls its queues: the server not being measured is stopped."""
    os.killpg(os.getpgid(server.pid), signal.SIGSTOP if paused else signal.SIGCONT)
    if not paused:
        time.sleep(0.5)  # let its threads (span export, stats) catch up before measuring


def processes(server: VllmServer) -> dict[str, list[int]]:
    """The server's processes by role: ``api`` (the leader), ``engine`` (EngineCore: its
    process title, else the process ``multiprocessing`` spawned from the API server),
    ``worker`` (its title, else one spawned from EngineCore), ``other`` (e.g.
    multiprocessing's resource tracker). Without ``setproctitle`` every one is ``python``."""
    pgid = os.getpgid(server.pid)
    found: dict[int, tuple[str, int, bool]] = {}  # pid -> (comm, parent, spawned)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:  # field 5: process group
            found[int(entry)] = (stat[stat.index("(") + 1: stat.rindex(")")], int(fields[1]),
                                 b"spawn_main" in cmdline)
    roles: dict[str, list[int]] = {"api": [], "engine": [], "worker": [], "other": []}
    engines = {pid for pid, (comm, parent, spawned) in found.items()
               if "Engine" in comm or (spawned and parent == server.pid and "Worker" not in comm)}
    for pid, (comm, parent, spawned) in found.items():
        role = ("api" if pid == server.pid else "engine" if pid in engines
                else "worker" if "Worker" in comm or (spawned and parent in engines)
                else "other")
        roles[role].append(pid)
    return roles


def _stat_fields(stat_path: str) -> list[str] | None:
    try:
        stat = Path(stat_path).read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _cpu_ticks(stat_path: str) -> int | None:
    """utime + stime (fields 14 and 15) from a /proc stat file; None when it is gone."""
    fields = _stat_fields(stat_path)
    return None if fields is None else int(fields[11]) + int(fields[12])


def process_cpu_ns(pid: int) -> int | None:
    """A process's CPU time (all its threads, finished ones included) in nanoseconds, read from
    its POSIX CPU clock (``clock_getcpuclockid``): ``/proc``'s utime + stime come in 10 ms ticks,
    which at 150 requests of 4 ms is a 1.7 % step. None when the process is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes (all their threads), in seconds: the CPU clock, else utime +
    stime from ``/proc`` (a kernel without per-process CPU clocks)."""
    total = 0.0
    for pid in pids:
        ns = process_cpu_ns(pid)
        total += (ns / 1e9 if ns is not None
                  else (_cpu_ticks(f"/proc/{pid}/stat") or 0) / _TICK)
    return total


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of these processes onto ``cpus`` (threads they start later inherit it)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                os.sched_setaffinity(int(tid), cpus)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU-seconds per thread id of one process (``schedstat``: nanoseconds on a CPU)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    out = {}
    for tid in tids:
        try:
            ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
        out[int(tid)] = int(ns) / 1e9
    return out


def counters(pid: int) -> dict[str, int]:
    """Cumulative counters of one process: read/write syscalls and bytes (all threads, sockets
    included), minor page faults, and its main thread's voluntary/involuntary context switches
    (vLLM's event loop: each voluntary switch is one sleep in ``epoll_wait``)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("rchar", "wchar", "syscr", "syscw"):
                out[key] = int(value)
        for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                out["main_" + key.split("_")[0]] = int(value)
    except OSError:
        return out
    fields = _stat_fields(f"/proc/{pid}/stat")
    if fields is not None:
        out["minflt"] = int(fields[7])  # field 10
    return out


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def py_spy() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (``py-spy dump``), when py-spy is installed."""
    try:
        text = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {pid: "MainThread"}
    names = {int(m[1]): m[2] for m in re.finditer(r'Thread (?:0x[0-9A-Fa-f]+ )?\(?(\d+)\)?'
                                                 r'[^"\n]*"([^"]+)"', text)}
    names.setdefault(pid, "MainThread")
    return names
