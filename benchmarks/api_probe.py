"""Runs a module as ``__main__`` (``python benchmarks/api_probe.py -m vllm.entrypoints...``) with
garbage-collection accounting that a Python profiler does not show: collections per generation,
the CPU time they took, and objects collected. Every arm of ``request_overhead.py --probe`` runs
under it alike. ``SIGUSR2`` writes the counts so far as JSON to ``$BENCH_PROBE_FILE``.

``SIGUSR1`` switches this process to the state written in ``$BENCH_PROBE_FILE.want``
(``{"hooks": "on"|"off", "vllm_tracing": "on"|"off"}``; without that file it toggles the hooks)
and writes the state reached to ``$BENCH_PROBE_FILE.switch``. ``hooks``: otel-ttft's hooks in
this process off (every wrapper undone, as ``uninstrument`` does) or back on:
``request_overhead.py --arms ...,off`` and ``paired_overhead.py`` measure the same API server
process with and without our hooks, run after run, which no pair of separate servers can (a
server keeps a speed of its own for its life: two identical ones differ by 10-50 % here).
``"flush": true`` exports every span ended so far, in this
process (the tracer providers' ``force_flush``), so that a run's spans are sent inside its own
counted window rather than in a later run's. ``vllm_tracing`` (with
``BENCH_PROBE_VLLM_TRACES=URL``): vLLM's own request tracing on or off in
this process, as ``--otlp-traces-endpoint URL`` would have set it at start: the three things that
flag decides in the API process at run time (``observability_config.otlp_traces_endpoint``, which
``AsyncLLM.add_request`` reads to keep a request's trace headers; ``OutputProcessor.
tracing_enabled``, which calls ``do_tracing`` for each finished request; the tracer provider
``do_tracing`` gets its tracer from). The provider is vLLM's own, built by vLLM's
``init_otel_tracer`` (a ``BatchSpanProcessor`` and an OTLP exporter to URL), not the one
``opentelemetry-instrument`` installed globally: vLLM's install of it as the global provider is
taken instead into the ``trace`` name its tracing module reads, so vLLM's spans cost what they
cost in a plain vLLM. Sent only between runs, when no request is in flight.

With ``BENCH_PROBE_METER=1`` (``request_overhead.py --meter``) the hooks a switch turns on are
metered (``hook_meter``): each wrapper's own time (its time minus the vLLM call inside), and the
deferred emission (``settle.Settler.settle``, on the event loop, outside any wrapper), counted
in this server's own main thread. ``SIGUSR2``'s dump then carries those sums, the calls, and
what a timer and the guard cost here, measured at start: our frames' own CPU inside a real, busy
server, beside the microbenchmark's figure for the same code. Not metered: the ``send`` in front
of each streamed chunk (two attribute tests; it awaits starlette's send) and the ``generate``
hook (content capture only). The timers cost the metered process itself about 1 us a hooked
call, so a metered run's CPU is not compared with another's.

With ``BENCH_PROBE_STUB=module:function,...`` each named function is replaced by one that does
nothing and returns ``None`` (``module:function=true``: returns ``True``), from the first switch
on (``paired_overhead.py --env``): what that part of our request path costs the server end to
end, where the meter sees only its own frames
(``otel_ttft.runtime.hooks.request.spans:RequestEmitter.emit``: every finished request is dropped
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
    path = os.environ.get("BENCH_PROBE_FILE")
    want: dict | None = None  # no file: the hooks the other way round
    if path and os.path.exists(f"{path}.want"):
        with open(f"{path}.want") as f:
            want = json.load(f)
    global _hooks_state
    if want is None or "hooks" in want:
        _hooks_state = _switch_hooks(want and want["hooks"])
    tracing = _VllmTracing.switch(want["vllm_tracing"]) if want and "vllm_tracing" in want \
        else _VllmTracing.state()
    if want and want.get("flush"):  # every span ended so far exported, in this process's CPU
        from opentelemetry import trace

        for provider in (trace.get_tracer_provider(), _VllmTracing.provider):
            if hasattr(provider, "force_flush"):
                provider.force_flush(10_000)
    if path:
        with open(f"{path}.switch.tmp", "w") as f:
            json.dump({"hooks": _hooks_state, "vllm_tracing": tracing}, f)
        os.replace(f"{path}.switch.tmp", f"{path}.switch")


def _switch_hooks(want: str | None) -> str:
    """Our hooks to ``want`` (``None``: the other way round); the state reached."""
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor, disabled_hooks

    instrumentor = VllmTTFTInstrumentor()  # a singleton
    hooks = instrumentor._hooks
    if hooks is None:
        return "none"
    cfg = instrumentor.state.config
    if _meter is not None:
        return _switch_metered(hooks, disabled_hooks(hooks.hooks, cfg), want)
    if want is None or (want == "on") != hooks.active:
        if hooks.active:
            hooks.remove()
        else:
            hooks.apply(disabled=disabled_hooks(hooks.hooks, cfg))
    return "on" if hooks.active else "off"


class _VllmTracing:
    """vLLM's own request tracing in this API process, on or off at run time
    (``BENCH_PROBE_VLLM_TRACES``): see the module docstring."""

    engines: list = []  # every AsyncLLM built in this process (one)
    provider = None  # vLLM's own tracer provider, built at the first switch
    on = False

    @classmethod
    def watch(cls) -> None:
        """Notes the ``AsyncLLM`` when vLLM builds it (its ``__init__`` wrapped until then)."""
        import wrapt

        def note(wrapped, instance, args, kwargs):
            cls.engines.append(instance)
            return wrapped(*args, **kwargs)

        wrapt.register_post_import_hook(
            lambda module: wrapt.wrap_function_wrapper(module, "AsyncLLM.__init__", note),
            "vllm.v1.engine.async_llm")

    @classmethod
    def state(cls) -> str:
        return "none" if cls.provider is None else "on" if cls.on else "off"

    @classmethod
    def switch(cls, want: str | None) -> str:
        endpoint = os.environ.get("BENCH_PROBE_VLLM_TRACES")
        if not endpoint or not cls.engines:
            return "none"
        from opentelemetry import trace
        from vllm.tracing import otel as vllm_otel

        if cls.provider is None:  # what ``--otlp-traces-endpoint`` builds, by vLLM's own code
            installed: list = []
            vllm_otel.set_tracer_provider = installed.append
            try:
                vllm_otel.init_otel_tracer("vllm.llm_engine", endpoint)
            finally:
                vllm_otel.set_tracer_provider = trace.set_tracer_provider
            cls.provider = installed[0]
        on = (not cls.on) if want is None else want == "on"
        engine = cls.engines[-1]
        engine.observability_config.otlp_traces_endpoint = endpoint if on else None
        engine.output_processor.tracing_enabled = on
        vllm_otel.trace = _OwnGlobal(cls.provider) if on else trace
        cls.on = on
        return "on" if on else "off"


class _OwnGlobal:
    """``opentelemetry.trace`` as vLLM's tracing module would see it in a plain vLLM: its own
    provider is the global one."""

    def __init__(self, provider) -> None:
        self._provider = provider

    def get_tracer(self, name, version=None, tracer_provider=None, schema_url=None,
                   attributes=None):
        return (tracer_provider or self._provider).get_tracer(name, version, schema_url,
                                                              attributes)

    def get_tracer_provider(self):
        return self._provider

    def __getattr__(self, name: str):
        from opentelemetry import trace

        return getattr(trace, name)


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


def _switch_metered(hooks, disabled: set[str], want: str | None) -> str:
    """The instrumentor's own hooks give way to metered copies; then metered on / off."""
    global _metered
    from otel_ttft.runtime.hooks.registry import HookSet

    if hooks.active:
        hooks.remove()
    on = _metered is not None and _metered.active
    if want is not None and (want == "on") == on:
        return want
    if on:
        _metered.remove()
        _free_functions(False)
        return "off"
    _metered = HookSet([_meter.timed(h) if _meterable(h) else replace(h, applied=False)
                        for h in hooks.hooks], hooks.state)  # the parts the hooks name
    _metered.apply(disabled=disabled)
    _free_functions(True)
    return "on"


def _meterable(hook) -> bool:
    """The API server's request hooks as the microbenchmark times them (not async, not
    streams)."""
    import inspect

    from otel_ttft.runtime.hooks.registry import Stream

    wrapper = hook.wrapper
    return (hook.name.startswith("request.") and hook.process == "api_server"
            and not (isinstance(wrapper, type) and issubclass(wrapper, Stream))
            and not inspect.iscoroutinefunction(wrapper))


_originals: dict = {}


def _free_functions(on: bool) -> None:
    """Our code that runs outside any wrapper, metered too (API process only)."""
    from otel_ttft.runtime.hooks.request import settle

    targets = {(settle.Settler, "settle"): "request.settle"}  # on the event loop (call_later)
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
    if os.environ.get("BENCH_PROBE_VLLM_TRACES"):
        _VllmTracing.watch()
    ours = sys.modules.get("otel_ttft")  # imported by opentelemetry-instrument, if it ran
    print(f"api_probe: otel_ttft from {getattr(ours, '__file__', None)}", flush=True)
    signal.signal(signal.SIGUSR2, _dump)
    signal.signal(signal.SIGUSR1, _switch)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
