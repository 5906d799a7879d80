"""Our hooks' own time inside the microbenchmark: each wrapper's time minus the vLLM call inside
it, and what the registry's guards add per call, measured per guard kind."""

from __future__ import annotations

import time
from dataclasses import replace

from otel_ttft.runtime.hooks.registry import PASS, Hook, Split, Swap, guard

# This thread's CPU time, not wall time: on a shared machine, time spent descheduled is not ours.
_clock = time.thread_time


class Meter:
    """Own time of the hook wrappers (their time minus the vLLM call inside), per process side,
    and their calls by guard kind (the registry's general guard, or the request path's lean one:
    ``Split``, ``Swap``)."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self.by_hook: dict[str, float] = {}
        """Own time per hook (where a side's time goes)."""

    def timed(self, hook: Hook) -> Hook:
        wrapper, side, name = hook.wrapper, hook.process, hook.name
        kind = "split" if isinstance(wrapper, (Split, Swap)) else "sync"
        if isinstance(wrapper, Split):
            wrapper = _as_call(wrapper)
        elif isinstance(wrapper, Swap):
            wrapper = _swap_as_call(wrapper)

        def run(wrapped, instance, args, kwargs):
            inner = 0.0

            def call(*a, **k):
                nonlocal inner
                t = _clock()
                try:
                    return wrapped(*a, **k)
                finally:
                    inner += _clock() - t

            t0 = _clock()
            try:
                return wrapper(call, instance, args, kwargs)
            finally:
                own = _clock() - t0 - inner
                self.own[side] = self.own.get(side, 0.0) + own
                self.by_hook[name] = self.by_hook.get(name, 0.0) + own
                self.calls[side, kind] = self.calls.get((side, kind), 0) + 1

        return replace(hook, wrapper=run, applied=False)

    def guard_s(self, side: str, per_call: dict[str, float]) -> float:
        """What the registry's guards add around this side's calls (not inside ``own``)."""
        return sum(n * per_call[kind] for (s, kind), n in self.calls.items() if s == side)


def _as_call(split: Split):
    """A ``Split`` as a ``(call, instance, args, kwargs)`` wrapper, so it can be timed alike."""
    before, after = split.before, split.after

    def wrapper(call, instance, args, kwargs):
        token = before(instance, args, kwargs) if before is not None else None
        if token is PASS or after is None:
            return call(*args, **kwargs)
        result = call(*args, **kwargs)
        after(token, instance, args, kwargs, result)
        return result

    return wrapper


def _swap_as_call(swap: Swap):
    """A ``Swap`` as a ``(call, instance, args, kwargs)`` wrapper."""
    prepare = swap.prepare

    def wrapper(call, instance, args, kwargs):
        swapped = prepare(instance, args, kwargs)
        if swapped is not None:
            args, kwargs = swapped
        return call(*args, **kwargs)

    return wrapper


def guard_overhead() -> tuple[float, dict[str, float]]:
    """The timer's own cost per timed call (subtracted), and what each kind of the registry's
    guard costs per call around a hook that does nothing (added: wrapt's dispatch, the guard's
    frames and checks; the general guard's call object and suppression check): in vLLM's API
    server at concurrency 1 these run once per streamed token."""
    import wrapt

    def noop(*a, **k):
        return None

    def through(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    def nothing(instance, args, kwargs):
        return PASS

    meter = Meter()
    timed = wrapt.FunctionWrapper(noop, meter.timed(Hook("t", "m:f", through, process="x")).wrapper)
    guarded = {"sync": wrapt.FunctionWrapper(noop, guard(Hook("g", "m:f", through))),
               "split": wrapt.FunctionWrapper(noop, guard(Hook("s", "m:f", Split(nothing))))}
    n = 20000
    best_timer = float("inf")
    best = {kind: float("inf") for kind in guarded}
    for _ in range(5):
        meter.own.clear()
        for _ in range(n):
            timed()
        best_timer = min(best_timer, meter.own["x"] / n)
        for kind, fn in guarded.items():
            t0 = _clock()
            for _ in range(n):
                fn()
            t1 = _clock()
            for _ in range(n):
                noop()
            best[kind] = min(best[kind], ((t1 - t0) - (_clock() - t1)) / n)
    return best_timer, {kind: max(value - best_timer, 0.0) for kind, value in best.items()}
