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

With ``BENCH_PROBE_METER=1`` (``request_overhead.py --meter``) the hooks a switch turns on are
metered (``hook_meter``): each wrapper's own time (its time minus the vLLM call inside), and
what runs outside any wrapper (the deferred emission ``_settle``, the ``send`` in front of every
streamed chunk), counted in this server's own main thread. ``SIGUSR2``'s dump then carries those
sums, the calls per guard kind, and what a timer and each guard cost here, measured at start:
our frames' own CPU inside a real, busy server, beside the microbenchmark's figure for the same
code. The timers cost the metered process itself about 1 us a hooked call, so a metered run's
CPU is not compared with another's.

With ``BENCH_PROBE_STUB=module:function,...`` each named function is replaced by one that does
nothing and returns ``None`` (``module:function=true``: returns ``True``), from the first switch
on (``paired_overhead.py --env``): what that part of our request path costs the server end to
end, where the meter sees only its own frames
(``otel_ttft.runtime.hooks.request.spans:emit_request``: every finished request is dropped
instead of emitted; only for attributing cost, never a working configuration). The meter's
``BENCH_PROBE_METER_FUNCS`` parts are reported with their calls per request (``calls:``).

With ``BENCH_PROBE_YOUNG_TYPES=1`` each young collection after the first switch counts what it
finds by type, per hooks state (``young_types`` in the dump): what a request leaves alive long
enough to bring the next collection closer (``paired_overhead.py --env``).
``BENCH_PROBE_GARBAGE_TYPES=1`` counts, by type and hooks state, what the collector found
unreachable (``garbage_types``, with ``gc.DEBUG_SAVEALL``, freed after each collection): objects
in reference cycles, which only a collection frees, so every one of them brings the next closer.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import signal
import sys
import time
from dataclasses import replace

_counts = [0, 0, 0]
_cpu_s = [0.0, 0.0, 0.0]
_collected = [0, 0, 0]
_started: list[float] = []
_meter = None  # hook_meter.Meter of the metered hooks (BENCH_PROBE_METER)
_metered = None  # their HookSet while applied
_calibration: dict = {}


_young_types: dict[str, dict[str, int]] = {}  # hooks state -> type -> young objects seen
_young_sampling = False  # BENCH_PROBE_YOUNG_TYPES
_garbage_types: dict[str, dict[str, int]] = {}  # hooks state -> type -> unreachable objects
_garbage_sampling = False  # BENCH_PROBE_GARBAGE_TYPES
_hooks_state: str | None = None  # None until the first switch: start-up is not sampled


def _on_gc(phase: str, info: dict) -> None:
    gen = info.get("generation", 0)
    if phase == "start":
        if _young_sampling and gen == 0 and _hooks_state:  # what filled a young collection
            counts = _young_types.setdefault(_hooks_state, {})
            for obj in gc.get_objects(0):
                name = f"{type(obj).__module__}.{type(obj).__qualname__}"
                counts[name] = counts.get(name, 0) + 1
        _started.append(time.thread_time())
    elif _started:
        if _garbage_sampling and gc.garbage:
            if _hooks_state:
                counts = _garbage_types.setdefault(_hooks_state, {})
                for obj in gc.garbage:
                    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
                    counts[name] = counts.get(name, 0) + 1
            gc.garbage.clear()
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
    if _garbage_sampling:
        data["garbage_types"] = {state: dict(sorted(c.items(), key=lambda kv: -kv[1])[:60])
                                 for state, c in _garbage_types.items()}
    if _young_sampling:
        data["young_types"] = {state: dict(sorted(c.items(), key=lambda kv: -kv[1])[:60])
                               for state, c in _young_types.items()}
    if _meter is not None:
        data["meter"] = {"own_s": dict(_meter.own), "by_hook_s": dict(_meter.by_hook),
                         "calls": {f"{side}/{kind}": n for (side, kind), n in
                                   _meter.calls.items()},
                         "metered": _metered is not None and _metered.active, **_calibration}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _switch(_signum: int, _frame: object) -> None:
    _stub_functions()
    from otel_ttft.runtime import config
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor, disabled_hooks

    hooks = VllmTTFTInstrumentor()._hooks  # the instrumentor is a singleton
    state = "none"
    if hooks is not None and _meter is not None:
        state = _switch_metered(hooks, disabled_hooks(hooks.hooks, config.current))
    elif hooks is not None:
        if hooks.active:
            hooks.remove()
        else:
            hooks.apply(disabled=disabled_hooks(hooks.hooks, config.current))
        state = "on" if hooks.active else "off"
    global _hooks_state
    _hooks_state = state
    path = os.environ.get("BENCH_PROBE_FILE")
    if path:
        with open(f"{path}.switch.tmp", "w") as f:
            json.dump({"hooks": state}, f)
        os.replace(f"{path}.switch.tmp", f"{path}.switch")


_stubbed = False


def _nothing(*args, **kwargs) -> None:
    return None


def _stub_functions() -> None:
    """``BENCH_PROBE_STUB``: applied once, at the first switch (every module is loaded by then)."""
    global _stubbed
    if _stubbed:
        return
    _stubbed = True
    for spec in filter(None, os.environ.get("BENCH_PROBE_STUB", "").split(",")):
        spec, _, value = spec.partition("=")  # ``=true``: the stub returns True
        module, _, qualname = spec.partition(":")
        *owners, name = qualname.split(".")
        owner = importlib.import_module(module)
        for part in owners:
            owner = getattr(owner, part)
        getattr(owner, name)  # a misspelt name fails here, not silently
        setattr(owner, name, _returning(_STUB_VALUES[value]) if value else _nothing)


_STUB_VALUES = {"true": True, "false": False, "none": None}


def _returning(value: object):
    def stub(*_args: object, **_kwargs: object) -> object:
        return value

    return stub


def _switch_metered(hooks, disabled: set[str]) -> str:
    """The instrumentor's own hooks give way to metered copies; then metered on / off."""
    global _metered
    from otel_ttft.runtime.hooks.registry import HookSet

    if hooks.active:
        hooks.remove()
    if _metered is not None and _metered.active:
        _metered.remove()
        _free_functions(False)
        return "off"
    _metered = HookSet([_meter.timed(h) if _meterable(h) else replace(h, applied=False)
                        for h in hooks.hooks])
    _metered.apply(disabled=disabled)
    _free_functions(True)
    return "on"


def _meterable(hook) -> bool:
    """The API server's request hooks as the microbenchmark times them (not async, not streams)."""
    import inspect

    from otel_ttft.runtime.hooks.registry import Split, Stream

    wrapper = hook.wrapper
    return (hook.name.startswith("request.") and hook.process == "api_server"
            and (isinstance(wrapper, Split) or not (
                (isinstance(wrapper, type) and issubclass(wrapper, Stream))
                or inspect.iscoroutinefunction(wrapper))))


_originals: dict = {}


def _free_functions(on: bool) -> None:
    """Our code that runs outside any wrapper, metered too (API process only)."""
    from otel_ttft.runtime.hooks.request import api, flush, settle

    # ``FirstOutputs`` includes vLLM's ``update_from_output`` it calls (three attribute tests).
    targets = {(settle, "_settle"): "request.settle",
               (flush._TimedSend, "__call__"): "request.send",
               (api.FirstOutputs, "__call__"): "request.first_outputs"}
    for spec in filter(None, os.environ.get("BENCH_PROBE_METER_FUNCS", "").split(",")):
        module, _, qualname = spec.partition(":")  # inclusive time only: not in the total
        *owners, name = qualname.split(".")
        owner = importlib.import_module(module)
        for part in owners:
            owner = getattr(owner, part)
        targets[owner, name] = "inclusive:" + spec
    for (owner, name), label in targets.items():
        if not on:
            if (owner, name) in _originals:
                setattr(owner, name, _originals.pop((owner, name)))
            continue
        original = _originals.setdefault((owner, name), getattr(owner, name))
        setattr(owner, name, _timed(original, label))


def _timed(fn, label: str):
    clock = time.thread_time

    def timed(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            own = clock() - t0
            _meter.by_hook[label] = _meter.by_hook.get(label, 0.0) + own
            calls = "calls:" + label  # 1e-6 a call: reported per request, it reads as calls
            _meter.by_hook[calls] = _meter.by_hook.get(calls, 0.0) + 1e-6
            if not label.startswith("inclusive:"):
                _meter.own["api_server"] = _meter.own.get("api_server", 0.0) + own
                _meter.calls["api_server", "free"] = _meter.calls.get(("api_server", "free"),
                                                                      0) + 1

    return timed


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: api_probe.py -m MODULE [ARGS...]")
    global _young_sampling, _garbage_sampling
    _young_sampling = bool(os.environ.get("BENCH_PROBE_YOUNG_TYPES"))
    _garbage_sampling = bool(os.environ.get("BENCH_PROBE_GARBAGE_TYPES"))
    if _garbage_sampling:
        gc.set_debug(gc.DEBUG_SAVEALL)
    gc.callbacks.append(_on_gc)
    if os.environ.get("BENCH_PROBE_METER"):
        global _meter
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from hook_meter import Meter, guard_overhead

        sys.path.pop(0)  # vLLM's imports see the path they would

        _meter = Meter()
        timer_s, guard_s = guard_overhead()  # in this process, before the server starts
        _calibration.update(timer_s=timer_s, guard_s=guard_s)
    signal.signal(signal.SIGUSR2, _dump)
    signal.signal(signal.SIGUSR1, _switch)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
