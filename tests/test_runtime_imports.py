"""What vLLM's processes import only measures: importing the runtime (instrumentor, plugin, distro,
every hook module) loads no argument parser, no vLLM and not the verdict's rules
(``otel_ttft.diagnosis``: loaded by the live verdict in its own thread after ready), and the lint
rule that keeps argparse, source reading and frame walking out of it bites."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")


def _runtime_modules() -> list[str]:
    hooks = ROOT / "otel_ttft" / "runtime" / "hooks"
    names = ["otel_ttft.runtime.instrumentor", "otel_ttft.runtime.plugin",
             "otel_ttft.runtime.distro"]
    for path in sorted(hooks.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _loaded_after_importing_the_runtime() -> list[str]:
    """The modules a fresh interpreter has loaded once it imported the runtime (no vLLM)."""
    modules = _runtime_modules()
    assert "otel_ttft.runtime.hooks.activation_verdict" in modules and len(modules) > 20
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_importing_the_runtime_loads_no_argument_parser_and_no_vllm():
    loaded = _loaded_after_importing_the_runtime()
    assert "otel_ttft.runtime.hooks.runners" in loaded  # the imports did run
    assert [m for m in loaded if m.split(".")[0] in ("argparse", "vllm")] == []


def test_the_live_verdict_imports_the_rule_only_when_it_judges():
    """``activation_verdict`` imports ``otel_ttft.diagnosis`` inside the verdict's thread, never
    at module level."""
    path = ROOT / "otel_ttft" / "runtime" / "hooks" / "activation_verdict.py"
    top = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import,
                                                                         ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert [n for n in names if n.startswith("otel_ttft.diagnosis")] == []


#: the rule and the vocabulary: loaded by the live verdict after ready, never at start-up
RULE = ("otel_ttft.diagnosis.activation", "otel_ttft.diagnosis.rule",
        "otel_ttft.diagnosis.change", "otel_ttft.diagnosis.vocabulary",
        "otel_ttft.diagnosis.vocabulary_store")


def test_importing_the_runtime_leaves_the_rule_unloaded():
    loaded = set(_loaded_after_importing_the_runtime())
    assert loaded.isdisjoint(RULE), sorted(loaded & set(RULE))


@pytest.mark.parametrize(("where", "banned"), [
    ("otel_ttft/runtime/hooks/x.py", True), ("otel_ttft/diagnosis/x.py", True),
    ("otel_ttft/semconv/x.py", True), ("otel_ttft/tools/x.py", False),
    ("scripts/x.py", False),
])
def test_lint_keeps_parsers_source_and_frames_out_of_the_runtime(where, banned):
    ruff = str(RUFF) if RUFF.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    snippet = ("import argparse\nimport inspect\nimport sys\n\n"
               "print(argparse, inspect.getsource(sys), inspect.getsourcelines(sys), "
               "sys._getframe(0))\n")
    proc = subprocess.run([ruff, "check", "--no-cache", "--select", "TID251",
                           "--stdin-filename", where, "-"], input=snippet, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    found = {name for name in ("argparse", "inspect.getsource", "inspect.getsourcelines",
                               "sys._getframe") if f"`{name}` is banned" in proc.stdout}
    assert found == ({"argparse", "inspect.getsource", "inspect.getsourcelines",
                      "sys._getframe"} if banned else set()), proc.stdout
