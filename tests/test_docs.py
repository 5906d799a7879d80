"""The docs site: its reference tables are generated from the code (``otel_ttft.tools.reference``)
and cover every name, setting and contract field; every page marker names a generator; and
``mkdocs build --strict`` (what ``make docs`` and CI run) succeeds with no warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import environment_variables
from otel_ttft.tools import reference
from otel_ttft.tools.analysis import contract

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _constants(*prefixes: str) -> dict[str, str]:
    return {k: v for k, v in vars(semconv).items()
            if k.startswith(prefixes) and isinstance(v, str)}


def test_descriptions_come_from_doc_comments_not_section_notes(tmp_path: Path):
    source = tmp_path / "vocab.py"
    source.write_text(
        '"""A vocabulary."""\n'
        "\n"
        "# a section note, not a description\n"
        'PLAIN = "plain"\n'
        'TRAILING = "t"  # said beside it\n'
        "#: said above it,\n"
        "#: over two lines\n"
        'ABOVE = (\n    "a",\n)\n'
        "#: both\n"
        'BOTH = "b"  # and beside\n'
        "#: shared by a tuple\n"
        'ONE, TWO = "1", "2"\n'
        'TABLE: dict[str, str] = {"k": "v"}  # annotated\n')
    module = types.ModuleType("vocab")
    module.__file__ = str(source)
    assert reference.module_descriptions(module) == {
        "PLAIN": "", "TRAILING": "said beside it", "ABOVE": "said above it, over two lines",
        "BOTH": "both; and beside", "ONE": "shared by a tuple", "TWO": "shared by a tuple",
        "TABLE": "annotated"}


def test_every_semconv_name_has_a_description():
    names = reference.names()
    public = {k for k in vars(semconv) if k.isupper() and not k.startswith("_")}
    assert {n.constant for n in names} == public  # every submodule is in reference.GROUPS
    assert [n.constant for n in names if not n.description] == []


def test_generated_reference_tables_every_stage_span_attribute_metric_and_event():
    text = reference.stages_table() + reference.names_tables()
    values = _constants("STAGE_", "SPAN_", "ATTR_", "METRIC_", "EVENT_", "GEN_AI_").values()
    missing = [v for v in values if f"`{v}`" not in text]
    assert missing == []
    assert set(semconv.VLLM_SPAN_STAGES) <= set(re.findall(r"`([^`]+)`",
                                                           reference.vllm_spans_table()))


def test_names_are_classified_by_what_they_name():
    kinds = {n.constant: n.kind for n in reference.names()}
    assert kinds["SPAN_ACTIVATION"] == "span"
    assert kinds["ATTR_STAGE"] == kinds["GEN_AI_REQUEST_MODEL"] == kinds["PROCESS_PID"] \
        == "attribute"
    assert kinds["METRIC_SERVER_TTFT"] == "metric"
    assert kinds["EVENT_CHILD_DIED"] == "event"
    assert kinds["GEN_AI_OPERATION_CHAT"] == kinds["TTFT_BUCKETS_S"] == "value"


def test_stage_table_gives_every_stage_its_family_order_and_fix():
    rows = [line for line in reference.stages_table().splitlines()[2:] if line.startswith("| `")]
    stages = [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]
    assert sorted(stages) == sorted(semconv.ALL_STAGES)
    families = [semconv.stage_family(s) for s in stages]
    assert families == sorted(families, key=semconv.STAGE_FAMILIES.index)
    first_decode = next(r for r in rows if r.startswith("| `first_decode`"))
    assert "no (after the first token)" in first_decode
    assert "`persist-artifacts`" in next(r for r in rows if r.startswith("| `warmup.compile`"))


def test_settings_page_lists_every_variable_with_its_docstring():
    settings = dict(reference.settings())
    declared = {v for k, v in vars(environment_variables).items() if k.startswith("OTEL_")}
    assert set(settings) == declared
    assert [name for name, doc in settings.items() if not doc] == []
    table = reference.settings_table()
    assert all(f"| `{name}` |" in table for name in declared)
    assert "``" not in table  # reStructuredText literals become Markdown code


def test_analysis_schema_describes_every_contract_field():
    models = [m for m in vars(contract).values() if isinstance(m, type)
              and issubclass(m, contract.BaseModel) and m is not contract.BaseModel
              and not m.__name__.startswith("_")]
    assert set(models) == set(reference.analysis_models())
    text = reference.analysis_schema()
    for model in models:
        for name, field in model.model_fields.items():
            key = field.alias or name
            assert f"| `{key}` |" in text, (model.__name__, key)
    assert "| `client_ttft_s` | number (≥ 0) | yes |" in text


def test_every_module_says_what_it_holds():
    modules = reference.modules()
    paths = {p for p, _ in modules}
    assert paths == {p.relative_to(ROOT).as_posix() for p in (ROOT / "otel_ttft").rglob("*.py")}
    assert [p for p, text in modules if not text] == []


def test_command_options_come_from_the_parsers():
    assert "`--driver`" in reference.replay_options()
    assert "`--max-growth`" in reference.check_options()
    assert set(reference.commands()) >= {"demo", "replay", "analyze", "report", "check", "doctor"}


def test_every_option_of_every_command_has_help_and_is_in_the_reference():
    import argparse

    page = reference.expand((DOCS / "reference.md").read_text())
    parsers = reference.command_parsers()
    assert set(parsers) == set(reference.commands())
    for name, (parser, text) in parsers.items():
        assert text.strip(), f"otel-ttft {name} has no one-line help"
        section = page.split(f"### `otel-ttft {name}`", 1)[1].split("\n### ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = f"otel-ttft {name} {action.option_strings or action.dest}"
            assert action.help and action.help.strip(), f"{label}: no help text"
            assert action.help != argparse.SUPPRESS, f"{label}: hidden from the reference"
            shown = action.option_strings or [action.metavar or action.dest.upper()]
            for flag in shown:
                assert f"`{flag}`" in section, f"{label}: not in the generated reference"


def test_page_markers_name_generators_and_every_generator_is_used():
    used = set()
    for page in DOCS.glob("*.md"):
        used |= set(reference.MARKER.findall(page.read_text()))
    assert used == set(reference.GENERATORS)
    with pytest.raises(ValueError, match="unknown reference table 'nope'"):
        reference.expand("# page\n<!-- reference: nope -->\n")
    assert "| `vllm.activation` |" in reference.expand("<!-- reference: names -->")


def test_mkdocs_builds_strict_with_no_warning(tmp_path: Path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    reference_page = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "reference:" not in reference_page  # every marker was replaced
    assert semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK in reference_page
