"""Hooks as data: lazy patching on import, undo on uninstrument, and the never-break-vLLM guard."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from otel_ttft.runtime.hooks.registry import Hook, HookSet, resolve


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """A module that is not imported yet, so post-import patching is exercised for real."""
    name = f"fake_vllm_mod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        class Runner:
            def load(self, x):
                return x * 2

            def fail(self):
                raise KeyError("vllm's own error")

        def helper(x):
            return x + 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _tracking(calls):
    def wrapper(call, instance, args, kwargs):
        calls.append(args)
        return call(*args, **kwargs)
    return wrapper


def test_patch_applies_when_module_is_imported_and_is_undone(fake_pkg):
    calls = []
    hooks = HookSet([Hook("t.load", f"{fake_pkg}:Runner.load", _tracking(calls)),
                     Hook("t.helper", f"{fake_pkg}:helper", _tracking(calls))])
    hooks.apply()
    mod = __import__(fake_pkg)
    assert mod.Runner().load(3) == 6 and mod.helper(1) == 2
    assert calls == [(3,), (1,)]
    hooks.remove()
    assert mod.Runner().load(4) == 8 and mod.helper(2) == 3
    assert len(calls) == 2, "wrappers still active after remove()"


def test_disabled_hook_is_not_applied(fake_pkg):
    calls = []
    hooks = HookSet([Hook("t.helper", f"{fake_pkg}:helper", _tracking(calls))])
    hooks.apply(disabled={"t.helper"})
    assert __import__(fake_pkg).helper(1) == 2 and calls == []


def test_failing_hook_leaves_vllm_running_and_logs_once(fake_pkg, caplog):
    def broken_before(call, instance, args, kwargs):
        raise RuntimeError("our bug")

    hook = Hook("t.broken", f"{fake_pkg}:Runner.load", broken_before)
    HookSet([hook]).apply()
    runner = __import__(fake_pkg).Runner()
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        assert [runner.load(i) for i in range(3)] == [0, 2, 4]
    assert hook.failed
    assert sum("t.broken" in r.getMessage() for r in caplog.records) == 1


def test_failing_hook_marks_the_open_span(fake_pkg):
    from opentelemetry import trace

    from otel_ttft import semconv
    from tests.otel_memory import memory_exporter

    exporter = memory_exporter()
    exporter.clear()

    def broken(call, instance, args, kwargs):
        raise RuntimeError("our bug")

    HookSet([Hook("t.marked", f"{fake_pkg}:helper", broken)]).apply()
    with trace.get_tracer("test").start_as_current_span("Load weights"):
        assert __import__(fake_pkg).helper(1) == 2
    (span,) = exporter.get_finished_spans()
    assert span.attributes[semconv.ATTR_HOOK_ERROR].startswith("t.marked: RuntimeError")


def test_failure_after_the_call_keeps_vllms_result(fake_pkg):
    runs = []

    def broken_after(call, instance, args, kwargs):
        result = call(*args, **kwargs)
        runs.append(result)
        raise RuntimeError("bookkeeping bug")

    HookSet([Hook("t.after", f"{fake_pkg}:Runner.load", broken_after)]).apply()
    assert __import__(fake_pkg).Runner().load(5) == 10
    assert runs == [10], "vLLM's function must run exactly once"


def test_vllms_own_exception_propagates_unchanged_and_hook_stays_on(fake_pkg):
    hook = Hook("t.fail", f"{fake_pkg}:Runner.fail", _tracking([]))
    HookSet([hook]).apply()
    with pytest.raises(KeyError, match="vllm's own error"):
        __import__(fake_pkg).Runner().fail()
    assert not hook.failed


def test_moved_target_is_skipped_with_one_warning(fake_pkg, caplog):
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        HookSet([Hook("t.moved", f"{fake_pkg}:Runner.gone", _tracking([]))]).apply()
        mod = __import__(fake_pkg)
    assert mod.Runner().load(1) == 2
    assert [r for r in caplog.records if "t.moved" in r.getMessage()]
    ok, detail = resolve(Hook("t.moved", f"{fake_pkg}:Runner.gone", _tracking([])))
    assert not ok and "Runner.gone" in detail


def test_resolve_rejects_inherited_methods(fake_pkg, tmp_path):
    (tmp_path / f"{fake_pkg}_sub.py").write_text(
        f"from {fake_pkg} import Runner\nclass Sub(Runner):\n    pass\n")
    ok, detail = resolve(Hook("t.sub", f"{fake_pkg}_sub:Sub.load", _tracking([])))
    assert not ok and "inherited" in detail
    sys.modules.pop(f"{fake_pkg}_sub", None)


# --- the one failure rule, on each wrapper kind ---------------------------------------------------

@pytest.fixture
def kinds_pkg(tmp_path, monkeypatch):
    """A not-yet-imported module with a sync function, a coroutine function and an async
    generator function, as vLLM has (``process_outputs``, ``AsyncLLM.sleep``, ``generate``)."""
    name = f"fake_kinds_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        def step(x):
            return x + 1

        async def sleep(x):
            return x * 2

        async def generate(n, fail_at=None):
            for i in range(n):
                if i == fail_at:
                    raise ValueError("vllm's own error")
                yield i
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _apply(*hooks):
    hook_set = HookSet(list(hooks))
    hook_set.apply()
    return hook_set


def test_sync_hook_that_fails_is_bypassed_on_every_later_call(kinds_pkg, caplog):
    calls = []

    def broken(call, instance, args, kwargs):
        calls.append(args)
        result = call(*args, **kwargs)
        raise RuntimeError("our bookkeeping")
        return result

    hook = Hook("t.sync", f"{kinds_pkg}:step", broken)
    hooks = _apply(hook)
    mod = __import__(kinds_pkg)
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        assert [mod.step(i) for i in range(5)] == [1, 2, 3, 4, 5]
    assert hook.failed and calls == [(0,)], "the hot path must not run a failed hook again"
    assert sum("t.sync" in r.getMessage() for r in caplog.records) == 1
    hooks.remove()


def test_async_hook_that_fails_is_bypassed_and_vllms_errors_pass(kinds_pkg, caplog):
    import asyncio

    calls = []

    async def broken(call, instance, args, kwargs):
        calls.append(args)
        raise RuntimeError("before vLLM's call")

    hook = Hook("t.async", f"{kinds_pkg}:sleep", broken)
    hooks = _apply(hook)
    mod = __import__(kinds_pkg)

    async def run():
        return [await mod.sleep(i) for i in range(3)]

    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        assert asyncio.run(run()) == [0, 2, 4]
    assert hook.failed and calls == [(0,)]
    assert sum("t.async" in r.getMessage() for r in caplog.records) == 1
    hooks.remove()


def _stream_class(fail_in=None):
    """A Stream observer class that records what the registry tells it, failing where asked."""
    from otel_ttft.runtime.hooks.registry import Stream

    log: list = []

    class Observed(Stream):
        __slots__ = ()

        def enter(self):
            log.append("enter")
            return "token"

        def leave(self, token):
            log.append(("leave", token))

        def first(self, item):
            log.append(("first", item))
            if fail_in == "first":
                raise RuntimeError("our bug")

        def item(self, item):
            log.append(("item", item))
            if fail_in == "item":
                raise RuntimeError("our bug")

        def close(self, outcome, error, last):
            log.append(("close", outcome, type(error).__name__ if error else None, last))

    return Observed, log


def _drain(agen, take=None):
    import asyncio

    async def run():
        out = []
        async for x in agen:
            out.append(x)
            if take is not None and len(out) == take:
                await agen.aclose()
                break
        return out

    return asyncio.run(run())


def test_stream_hook_sees_each_item_and_how_the_stream_ended(kinds_pkg):
    from otel_ttft.runtime.hooks.registry import ABORTED, FAILED, FINISHED

    observed, log = _stream_class()
    hooks = _apply(Hook("t.stream", f"{kinds_pkg}:generate", observed))
    mod = __import__(kinds_pkg)
    assert _drain(mod.generate(3)) == [0, 1, 2]
    assert log == ["enter", ("leave", "token"), ("first", 0), ("item", 1), ("item", 2),
                   ("close", FINISHED, None, 2)]
    log.clear()
    assert _drain(mod.generate(5), take=2) == [0, 1]
    assert log[-1] == ("close", ABORTED, "GeneratorExit", 1), "the last item handed over"
    log.clear()
    with pytest.raises(ValueError, match="vllm's own error"):
        _drain(mod.generate(5, fail_at=2))
    assert log[-1] == ("close", FAILED, "ValueError", 1)
    hooks.remove()


def test_stream_hook_without_each_item_sees_first_and_last_only(kinds_pkg):
    from otel_ttft.runtime.hooks.registry import ABORTED, FINISHED

    observed, log = _stream_class()
    observed.each_item = False  # the hot path: nothing per item but the hand-over
    hooks = _apply(Hook("t.stream_lean", f"{kinds_pkg}:generate", observed))
    mod = __import__(kinds_pkg)
    assert _drain(mod.generate(4)) == [0, 1, 2, 3]
    assert log == ["enter", ("leave", "token"), ("first", 0), ("close", FINISHED, None, 3)]
    log.clear()
    assert _drain(mod.generate(5), take=3) == [0, 1, 2]
    assert log[-1] == ("close", ABORTED, "GeneratorExit", 2)
    hooks.remove()


@pytest.mark.parametrize("where", ["first", "item"])
def test_stream_hook_that_fails_never_breaks_the_stream_and_stands_aside(kinds_pkg, caplog,
                                                                         where):
    observed, log = _stream_class(fail_in=where)
    hook = Hook("t.stream_fail", f"{kinds_pkg}:generate", observed)
    hooks = _apply(hook)
    mod = __import__(kinds_pkg)
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        assert _drain(mod.generate(4)) == [0, 1, 2, 3]
    assert hook.failed
    assert not [e for e in log if e[0] == "close"], "a failed observer is not called again"
    count = len(log)
    agen = mod.generate(2)
    assert agen.__qualname__ == "generate", "later calls get vLLM's own generator, no layer"
    assert _drain(agen) == [0, 1] and len(log) == count
    assert sum("t.stream_fail" in r.getMessage() for r in caplog.records) == 1
    hooks.remove()


def test_suppressed_instrumentation_bypasses_every_kind(kinds_pkg):
    import asyncio

    from opentelemetry.instrumentation.utils import suppress_instrumentation

    calls = []

    def sync_w(call, instance, args, kwargs):
        calls.append("sync")
        return call(*args, **kwargs)

    async def async_w(call, instance, args, kwargs):
        calls.append("async")
        return await call(*args, **kwargs)

    observed, log = _stream_class()
    hooks = _apply(Hook("t.s", f"{kinds_pkg}:step", sync_w),
                   Hook("t.a", f"{kinds_pkg}:sleep", async_w),
                   Hook("t.g", f"{kinds_pkg}:generate", observed))
    mod = __import__(kinds_pkg)
    with suppress_instrumentation():
        assert mod.step(1) == 2
        assert asyncio.run(mod.sleep(2)) == 4
        assert _drain(mod.generate(2)) == [0, 1]
    assert calls == [] and log == []
    assert mod.step(1) == 2 and calls == ["sync"]  # and back on outside
    hooks.remove()


def test_an_api_server_hook_is_not_installed_in_a_spawned_engine_process(fake_pkg, monkeypatch):
    """vLLM's EngineCore and workers are spawned (``--multiprocessing-fork`` on their command
    line): a hook scoped to the API server is never installed there."""
    import sys

    monkeypatch.setattr(sys, "argv", [*sys.argv, "--multiprocessing-fork"])
    scoped = Hook("t.api", f"{fake_pkg}:Runner.load", lambda call, i, a, k: call(*a, **k),
                  process="api_server")
    anywhere = Hook("t.any", f"{fake_pkg}:helper", lambda call, i, a, k: call(*a, **k))
    hooks = HookSet([scoped, anywhere])
    hooks.apply()
    try:
        __import__(fake_pkg)
        assert not scoped.applied and anywhere.applied
    finally:
        hooks.remove()


def test_a_hook_naming_a_state_part_is_handed_that_part(fake_pkg):
    """The openai-v2 shape: state built by the instrumentor and passed to the wrapper, never a
    module global."""
    from otel_ttft.runtime.config import Config
    from otel_ttft.runtime.state import PartSpec, ProcessState

    class Counts:
        def __init__(self, ps):
            self.config, self.calls, self.closed = ps.config, [], False

        def close(self):
            self.closed = True

    def counted(part, call, instance, args, kwargs):
        part.calls.append(args)
        return call(*args, **kwargs)

    state = ProcessState(Config(cold_requests=7), [PartSpec("counts", Counts)])
    hooks = HookSet([Hook("t.helper", f"{fake_pkg}:helper", counted, state="counts")], state)
    hooks.apply()
    assert __import__(fake_pkg).helper(1) == 2
    part = state.part("counts")
    assert part.calls == [(1,)] and part.config.cold_requests == 7
    hooks.remove()
    state.close()
    assert part.closed and state.parts == {}


def test_state_closes_newest_first_and_one_failure_does_not_stop_the_rest(caplog):
    from otel_ttft.runtime.config import Config
    from otel_ttft.runtime.state import PartSpec, ProcessState

    closed = []

    def part(name, fail=False):
        class P:
            def close(self):
                closed.append(name)
                if fail:
                    raise RuntimeError("boom")
        return PartSpec(name, lambda ps: P())

    state = ProcessState(Config(), [part("a"), part("b", fail=True), part("c")])
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        state.close()
    assert closed == ["c", "b", "a"]
    assert "closing state b failed" in caplog.text
    with pytest.raises(ValueError):
        ProcessState(Config(), [part("a"), part("a")])


def test_remove_leaves_no_import_watch_behind(fake_pkg):
    """A target module never imported is no longer waited for after remove(): nothing of ours
    stays on ``sys.meta_path``, and a second apply/remove cycle adds exactly one watch."""
    from otel_ttft.runtime.hooks.on_import import ImportWatch

    def ours():
        return [f for f in sys.meta_path if isinstance(f, ImportWatch)]

    before = len(ours())
    calls = []
    for _ in range(2):
        hooks = HookSet([Hook("t.helper", f"{fake_pkg}:helper", _tracking(calls))])
        hooks.apply()
        assert len(ours()) == before + 1
        hooks.remove()
        assert len(ours()) == before
    mod = __import__(fake_pkg)
    assert mod.helper(1) == 2 and calls == []
    assert mod.__spec__.loader.__class__.__name__ != "_ThenNotify"


def test_the_watch_leaves_once_every_watched_module_is_imported(fake_pkg):
    from otel_ttft.runtime.hooks.on_import import ImportWatch

    calls = []
    hooks = HookSet([Hook("t.helper", f"{fake_pkg}:helper", _tracking(calls))])
    hooks.apply()
    mod = __import__(fake_pkg)
    assert not any(isinstance(f, ImportWatch) and f is hooks._watch for f in sys.meta_path)
    assert mod.__loader__.__class__.__name__ != "_ThenNotify"
    assert mod.helper(2) == 3 and calls == [(2,)]
    hooks.remove()
