"""The per-figure table doctor prints and docs/gpu-checks.md shows (issue 55): every attribute
is one of ours, every test it names exists, and both renderings carry every figure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from otel_ttft.tools import doctor, figures, reference

ROOT = Path(__file__).resolve().parent.parent


def _our_values() -> set[str]:
    return {n.value for n in reference.names() if isinstance(n.value, str)}


def test_every_figure_names_our_attributes_and_existing_tests():
    ours = _our_values()
    for figure in figures.FIGURES:
        assert figure.attributes and set(figure.attributes) <= ours, figure.name
        assert figure.v1 and figure.v2
        tests = [c for c in figure.checked if c.startswith("tests/")]
        assert tests, f"{figure.name}: no CPU test checks it"
        for check in tests:
            path, _, name = check.partition("::")
            tree = ast.parse((ROOT / path).read_text())
            assert name in {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}, \
                check


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_doctor_and_the_docs_show_every_figure():
    text = doctor.render(doctor.collect())
    table = figures.table()
    for figure in figures.FIGURES:
        assert f"  {figure.name} [" in text and f"| {figure.name} |" in table
    assert "<!-- reference: gpu-figures -->" in (ROOT / "docs" / "gpu-checks.md").read_text()
    assert reference.expand("<!-- reference: gpu-figures -->") == table.rstrip("\n")
