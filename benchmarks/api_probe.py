"""Runs a module as ``__main__`` (``python benchmarks/api_probe.py -m vllm.entrypoints...``) with
garbage-collection accounting that a Python profiler does not show: collections per generation,
the CPU time they took, and objects collected. Every arm of ``request_overhead.py --probe`` runs
under it alike. ``SIGUSR2`` writes the counts so far as JSON to ``$BENCH_PROBE_FILE``.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import time

_counts = [0, 0, 0]
_cpu_s = [0.0, 0.0, 0.0]
_collected = [0, 0, 0]
_started: list[float] = []


def _on_gc(phase: str, info: dict) -> None:
    gen = info.get("generation", 0)
    if phase == "start":
        _started.append(time.thread_time())
    elif _started:
        _cpu_s[gen] += time.thread_time() - _started.pop()
        _counts[gen] += 1
        _collected[gen] += info.get("collected", 0)


def _dump(_signum: int, _frame: object) -> None:
    path = os.environ.get("BENCH_PROBE_FILE")
    if not path:
        return
    data = {"collections": list(_counts), "gc_cpu_s": list(_cpu_s),
            "collected": list(_collected),
            "threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: api_probe.py -m MODULE [ARGS...]")
    gc.callbacks.append(_on_gc)
    signal.signal(signal.SIGUSR2, _dump)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
