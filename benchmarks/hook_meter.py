"""Our hooks' own time: each wrapper's time minus the vLLM call inside it, and what the registry's
guard adds per call (wrapt's dispatch, the guard's frames and checks), measured here."""

from __future__ import annotations

import time
from dataclasses import replace

from otel_ttft.runtime.hooks.registry import Hook, guard

# This thread's CPU time, not wall time: on a shared machine, time spent descheduled is not ours.
_clock = time.thread_time


_NO_PART = object()


class Meter:
    """Own time of the hook wrappers (their time minus the vLLM call inside), per process side
    and per hook, and their calls per side."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self.by_hook: dict[str, float] = {}
        """Own time per hook (where a side's time goes)."""

    def timed(self, hook: Hook) -> Hook:
        """A copy of ``hook`` (not applied) whose wrapper is timed; a plain ``(call, instance,
        args, kwargs)`` wrapper only (not a ``Stream``, not ``async``)."""
        wrapper, side, name = hook.wrapper, hook.process, hook.name

        def run(wrapped, instance, args, kwargs, part=_NO_PART):
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
                if part is _NO_PART:
                    return wrapper(call, instance, args, kwargs)
                return wrapper(part, call, instance, args, kwargs)
            finally:
                own = _clock() - t0 - inner
                self.own[side] = self.own.get(side, 0.0) + own
                self.by_hook[name] = self.by_hook.get(name, 0.0) + own
                self.calls[side, "sync"] = self.calls.get((side, "sync"), 0) + 1

        if hook.state is not None:  # the registry hands its state part first (outside the timer)
            unbound = run

            def run(part, wrapped, instance, args, kwargs):
                return unbound(wrapped, instance, args, kwargs, part)

        return replace(hook, wrapper=run, applied=False)

    def guard_s(self, side: str, per_call: dict[str, float]) -> float:
        """What the registry's guard adds around this side's calls (not inside ``own``)."""
        return sum(n * per_call[kind] for (s, kind), n in self.calls.items() if s == side)


def guard_overhead() -> tuple[float, dict[str, float]]:
    """The timer's own cost per timed call (subtracted), and what the registry's guard costs per
    call around a hook that does nothing (added: wrapt's dispatch, the guard's frames, its
    suppression check and call object): in vLLM's API server at concurrency 1 these run once
    per streamed token."""
    import wrapt

    def noop(*a, **k):
        return None

    def through(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    meter = Meter()
    timed = wrapt.FunctionWrapper(noop, meter.timed(Hook("t", "m:f", through, process="x")).wrapper)
    guarded = {"sync": wrapt.FunctionWrapper(noop, guard(Hook("g", "m:f", through)))}
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
