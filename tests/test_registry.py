"""Hooks as data: lazy patching on import, undo on uninstrument, and the never-break-vLLM guard."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from otel_ttft.hooks.registry import Hook, HookSet, resolve


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
