"""Runs a module as ``__main__`` (``python benchmarks/api_probe.py -m vllm.entrypoints...``) with
garbage-collection accounting that a Python profiler does not show: collections per generation,
the CPU time they took, and objects collected. Every arm of ``request_overhead.py --probe`` runs
under it alike. ``SIGUSR2`` writes the counts so far as JSON to ``$BENCH_PROBE_FILE``.

``SIGUSR1`` switches otel-ttft's hooks in this process off (every wrapper undone, as
``uninstrument`` does) or back on, and writes ``{"hooks": "on"|"off"}`` to
``$BENCH_PROBE_FILE.switch``: ``request_overhead.py --switch`` measures the same API server process
with and without our hooks, run after run, which no pair of separate servers can (a server keeps a
speed of its own for its life: two identical ones differ by 10-50 % here). Sent only between runs,
when no request is in flight.
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


def _switch(_signum: int, _frame: object) -> None:
    from otel_ttft.runtime import config
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor, disabled_hooks

    hooks = VllmTTFTInstrumentor()._hooks  # the instrumentor is a singleton
    state = "none"
    if hooks is not None:
        if hooks.active:
            hooks.remove()
        else:
            hooks.apply(disabled=disabled_hooks(hooks.hooks, config.current))
        state = "on" if hooks.active else "off"
    path = os.environ.get("BENCH_PROBE_FILE")
    if path:
        with open(f"{path}.switch.tmp", "w") as f:
            json.dump({"hooks": state}, f)
        os.replace(f"{path}.switch.tmp", f"{path}.switch")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: api_probe.py -m MODULE [ARGS...]")
    gc.callbacks.append(_on_gc)
    signal.signal(signal.SIGUSR2, _dump)
    signal.signal(signal.SIGUSR1, _switch)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
