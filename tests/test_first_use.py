"""First use in the API process without vLLM: a module loaded for the first time is one fill
(its own imports inside it), a module already loaded costs nothing, and only the API process
records (the real first request is checked in test_verdicts_vllm)."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.hooks import first_use
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.state import PartSpec, ProcessState
from tests.request_engine import current_config


@pytest.fixture
def imports_hooked(monkeypatch: pytest.MonkeyPatch):
    hook = next(h for h in first_use.HOOKS if h.name == "request.first_use.imports")
    state = ProcessState(current_config(), [PartSpec(first_use.PART, first_use.FirstUse)])
    state.identity.set_kind(semconv.PROCESS_API_SERVER)
    hooks = HookSet([hook], state)
    hooks.apply()
    assert hook.applied
    try:
        yield hooks.state.part(first_use.PART)
    finally:
        hooks.remove()
        hooks.state.close()
    assert not hook.applied


def _modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tag: str) -> str:
    (tmp_path / f"fu_outer_{tag}.py").write_text(
        f"import time\nimport fu_inner_{tag}\ntime.sleep(0.02)\n")
    (tmp_path / f"fu_inner_{tag}.py").write_text("import time\ntime.sleep(0.02)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"fu_outer_{tag}"


def test_a_first_import_is_one_fill_and_a_second_costs_nothing(imports_hooked, tmp_path,
                                                               monkeypatch):
    name = _modules(tmp_path, monkeypatch, "a")
    start = time.monotonic()
    importlib.import_module(name)
    fills = imports_hooked.within(start, time.monotonic())
    assert [label for _, _, label in fills] == [first_use.IMPORTS]  # the inner one nests in it
    (begin, end, _), = fills
    assert end - begin >= 0.04  # both modules' work, on the one clock
    again = time.monotonic()
    importlib.import_module(name)  # in sys.modules: the import system loads nothing
    assert imports_hooked.within(again, time.monotonic()) == []
    for mod in (name, "fu_inner_a"):
        sys.modules.pop(mod, None)


def test_other_processes_record_nothing(imports_hooked, tmp_path, monkeypatch):
    imports_hooked.identity.set_kind(semconv.PROCESS_ENGINE_CORE)
    name = _modules(tmp_path, monkeypatch, "b")
    start = time.monotonic()
    importlib.import_module(name)
    assert imports_hooked.within(start, time.monotonic()) == []
    for mod in (name, "fu_inner_b"):
        sys.modules.pop(mod, None)


def test_a_window_sees_only_the_fills_that_began_inside_it():
    part = first_use.FirstUse(ProcessState(current_config()))
    part.fills.append((10.0, 10.5, "x"))
    part.fills.append((20.0, 20.1, "y"))
    assert [f[2] for f in part.within(9.0, 15.0)] == ["x"]
    assert part.within(10.6, 19.0) == []
    assert part.within(25.0, 30.0) == []  # the newest ended before: one comparison
