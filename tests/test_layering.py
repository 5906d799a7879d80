"""The layering contract (``.importlinter``, run by ``make lint``) holds for the package, and
fails when a runtime module imports a tool, when two modules import each other, or when what
vLLM's processes import imports argparse, even lazily inside a function: a copy of the package
is broken on purpose and checked with the same tool."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / ".importlinter"), "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "otel_ttft", tmp_path / "otel_ttft",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_package_keeps_every_contract():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 kept, 0 broken" in proc.stdout


def test_a_runtime_module_importing_a_tool_lazily_breaks_the_contract(copy: Path):
    clock = copy / "otel_ttft" / "runtime" / "clock.py"
    clock.write_text(clock.read_text() + "\n\ndef _report():\n"
                     "    from otel_ttft.tools.analysis import verdict  # noqa: F401\n")
    proc = _lint(copy)
    assert proc.returncode != 0
    assert ("the runtime (what every vLLM process imports) never imports a tool BROKEN"
            in proc.stdout)
    assert "otel_ttft.runtime.clock -> otel_ttft.tools.analysis.verdict" in proc.stdout


def test_two_modules_importing_each_other_break_the_contract(copy: Path):
    spans = copy / "otel_ttft" / "runtime" / "telemetry" / "spans.py"
    spans.write_text(spans.read_text() + "\n\ndef _tracker():\n"
                     "    from otel_ttft.runtime import inflight  # noqa: F401\n")
    proc = _lint(copy)
    assert proc.returncode != 0
    assert "no import cycle between modules or packages BROKEN" in proc.stdout


def test_the_diagnosis_importing_argparse_lazily_breaks_the_contract(copy: Path):
    rule = copy / "otel_ttft" / "diagnosis" / "rule.py"
    rule.write_text(rule.read_text() + "\n\ndef _cli():\n"
                    "    import argparse  # noqa: F401\n")
    proc = _lint(copy)
    assert proc.returncode != 0
    assert "parses no arguments (argparse belongs to the tools)BROKEN" in proc.stdout
    assert "otel_ttft.diagnosis.rule -> argparse" in proc.stdout
