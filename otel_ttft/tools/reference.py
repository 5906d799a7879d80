"""Reference tables for the docs, generated from the code they describe, so they cannot drift.

``mkdocs build`` (``make docs``) replaces each ``<!-- reference: NAME -->`` line of a page with
the table :data:`GENERATORS` names (``scripts/mkdocs_hooks.py``). The names and their
descriptions come from ``otel_ttft.semconv``: a name's description is its ``#:`` comment lines
directly above it followed by the comment on its own line (plain ``#`` lines above a name are
section notes, not descriptions). Settings come from the docstrings in
``runtime/environment_variables.py``, the analysis schema from the pydantic models in
``tools/analysis/contract.py``, command options from the CLI's own parser.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime import environment_variables
from otel_ttft.semconv import activation, load, parallel, replay, request, stages, telemetry

#: semconv's submodules in the order the docs show them, with their headings.
GROUPS: tuple[tuple[ModuleType, str], ...] = (
    (stages, "Stages"), (activation, "Activation"), (load, "Load"),
    (parallel, "Parallel workers"), (request, "Request"),
    (replay, "Replay"), (telemetry, "Telemetry health"),
)
KINDS = ("span", "attribute", "metric", "event", "value")
_KIND_TITLES = {"span": "Spans", "attribute": "Attributes", "metric": "Metrics",
                "event": "Span events", "value": "Other names and values"}
_ATTRIBUTE_KEY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.MULTILINE)


@dataclass(frozen=True)
class Name:
    """One public name of ``otel_ttft.semconv``."""

    group: str  # the submodule that defines it
    constant: str
    value: Any
    kind: str  # stage, span, attribute, metric, event or value
    description: str


def _kind(constant: str, value: Any) -> str:
    for prefix, kind in (("STAGE_", "stage"), ("SPAN_", "span"), ("METRIC_", "metric"),
                         ("EVENT_", "event"), ("ATTR_", "attribute")):
        if constant.startswith(prefix) and isinstance(value, str):
            return kind
    if isinstance(value, str) and _ATTRIBUTE_KEY.match(value):
        return "attribute"  # a GenAI or OTel key without our ATTR_ prefix (gen_ai.request.model)
    return "value"


def _comment_text(token: str) -> str:
    return token.lstrip("#").removeprefix(":").strip()


def module_descriptions(module: ModuleType) -> dict[str, str]:
    """Each top-level constant of ``module`` -> its description (empty when it has none)."""
    source = Path(module.__file__ or "").read_text(encoding="utf-8")
    own_line: dict[int, str] = {}  # line -> a comment alone on its line
    trailing: dict[int, str] = {}  # line -> the comment after code on that line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            before = tok.line[:tok.start[1]].strip()
            (trailing if before else own_line)[tok.start[0]] = tok.string
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in _target_names(target)]
        elif isinstance(node, ast.AnnAssign):
            targets = list(_target_names(node.target))
        else:
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in own_line and own_line[line].startswith("#:"):
            above.insert(0, _comment_text(own_line[line]))
            line -= 1
        parts = [" ".join(above), _comment_text(trailing.get(node.lineno, ""))]
        text = "; ".join(p for p in parts if p)
        for name in targets:
            out[name] = text
    return out


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)


def names() -> list[Name]:
    """Every public upper-case name of semconv, grouped by the submodule that defines it."""
    found = []
    for module, _title in GROUPS:
        described = module_descriptions(module)
        group = module.__name__.rsplit(".", 1)[-1]
        for constant, text in described.items():
            if not constant.isupper() or constant.startswith("_"):
                continue
            value = getattr(semconv, constant)
            found.append(Name(group, constant, value, _kind(constant, value), text))
    return found


def _cell(text: Any) -> str:
    return _rst_to_md(str(text)).replace("\n", " ").replace("|", "\\|")


def _code(value: Any) -> str:
    return f"`{value}`"


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _render_value(value: Any) -> str:
    if isinstance(value, (tuple, list, frozenset, set)):
        return ", ".join(_code(v) for v in value)
    return _code(value)


def stages_table() -> str:
    """Every stage, family by family in the design's order, with the fix a verdict gives."""
    from otel_ttft.tools.analysis.verdict import FIXES

    described = {n.value: n for n in names() if n.kind == "stage"}
    rows = []
    for family in semconv.STAGE_FAMILIES:
        for stage in semconv.ALL_STAGES:
            if semconv.stage_family(stage) != family:
                continue
            in_ttft = "yes" if family in semconv.TTFT_PIPELINE else "no (after the first token)"
            fix, change = FIXES.get(stage, FIXES.get(family, ("", "")))
            rows.append((_code(stage), described[stage].description, in_ttft,
                         _code(fix) if fix else "", change))
    return _table(("stage", "what it covers", "part of TTFT", "verdict", "what to change"), rows)


def vllm_spans_table() -> str:
    """vLLM's own start-up spans and the stage each is tagged with."""
    rows = [(_code(span), _code(stage)) for span, stage in semconv.VLLM_SPAN_STAGES.items()]
    return _table(("vLLM span", "tagged ttft.stage"), rows)


def names_tables() -> str:
    """Spans, attributes, metrics, events and other values, one section per semconv group."""
    out = []
    everything = names()
    for module, title in GROUPS:
        group = module.__name__.rsplit(".", 1)[-1]
        mine = [n for n in everything if n.group == group and n.kind != "stage"]
        doc = _rst_to_md(" ".join((module.__doc__ or "").split()))
        out.append(f"## {title}\n\n{doc} (`otel_ttft/semconv/{group}.py`)\n")
        for kind in KINDS:
            rows = [n for n in mine if n.kind == kind]
            if not rows:
                continue
            out.append(f"### {title}: {_KIND_TITLES[kind].lower()}\n")
            if kind == "value":
                out.append(_table(("constant", "value", "what"), [
                    (_code(n.constant), _dict_or_value(n.value), n.description) for n in rows]))
            else:
                out.append(_table(("name", "constant", "what"), [
                    (_code(n.value), _code(n.constant), n.description) for n in rows]))
    return "\n".join(out)


def _dict_or_value(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"`{k}` → `{v}`" for k, v in value.items())
    return _render_value(value)


def settings() -> list[tuple[str, str]]:
    """(variable, docstring) of every setting in ``runtime/environment_variables.py``."""
    source = Path(environment_variables.__file__).read_text(encoding="utf-8")
    body = ast.parse(source).body
    found = []
    for node, following in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("OTEL_")):
            continue
        doc = ""
        if (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            doc = " ".join(following.value.value.split())
        found.append((getattr(environment_variables, node.targets[0].id), doc))
    return found


def settings_table() -> str:
    """Every environment variable otel-ttft reads, with its docstring."""
    rows = [(_code(name), doc) for name, doc in settings()]
    return _table(("variable", "what, and its default"), rows)


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


def analysis_models() -> list[type]:
    from otel_ttft.tools.analysis import contract

    return [contract.Analysis, contract.Run, contract.Request, contract.Evidence,
            contract.Segment, contract.Scenario, contract.Verdict, contract.ChainLink,
            contract.Verification, contract.GatedActivation, contract.RankGate]


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_schema_type(schema.get('items', {}))}"
    if kind == "object":
        values = schema.get("additionalProperties")
        return f"object of {_schema_type(values)}" if isinstance(values, dict) else "object"
    bounds = [f"{word} {schema[key]}" for key, word in
              (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"))
              if key in schema]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def analysis_schema() -> str:
    """One table per model of the analysis.json contract: field, type, required, meaning."""
    out = []
    for model in analysis_models():
        schema = model.model_json_schema(by_alias=True)
        required = set(schema.get("required", ()))
        doc = " ".join((model.__doc__ or "").split())
        out.append(f"### `{model.__name__}`\n\n{doc}\n" if doc else f"### `{model.__name__}`\n")
        rows = [(_code(field), _schema_type(spec), "yes" if field in required else "no",
                 spec.get("description", ""))
                for field, spec in schema["properties"].items()]
        out.append(_table(("field", "type", "required", "meaning"), rows))
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser,
                                                                     str]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}


def commands() -> dict[str, str]:
    """``otel-ttft`` subcommand -> its one-line help, from the CLI's parser."""
    from otel_ttft.tools.cli import build_parser

    return {name: text for name, (_sub, text) in _subcommands(build_parser()).items()}


def commands_table() -> str:
    return _table(("command", "what"),
                  [(_code(f"otel-ttft {name}"), text) for name, text in commands().items()])


def _options_table(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(_code(f) for f in action.option_strings)
        default = ("" if action.default is None or action.default is False
                   or action.default in ([], argparse.SUPPRESS) else action.default)
        rows.append((flags, _code(default) if default != "" else "", action.help or ""))
    return _table(("option", "default", "what"), rows)


def _arguments_table(parser: argparse.ArgumentParser) -> str:
    """Every argument of ``parser``, positionals first, then the options (``--help`` aside)."""
    rows = []
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        rows.append((_code(action.metavar or action.dest.upper()), "", action.help or ""))
    table = _options_table(parser)
    if not rows:
        return table
    header, rule, *option_rows = table.rstrip("\n").split("\n")
    return "\n".join([header.replace("| option |", "| argument |"), rule,
                      *(_table(("argument", "default", "what"), rows).split("\n")[2:-1]),
                      *option_rows]) + "\n"


def command_parsers() -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """``otel-ttft`` subcommand -> (its parser, its one-line help); ``doctor``'s parser is its
    own (the CLI hands it everything after ``doctor``)."""
    from otel_ttft.tools import doctor
    from otel_ttft.tools.cli import build_parser

    found = _subcommands(build_parser())
    found["doctor"] = (doctor.build_parser(), found["doctor"][1])
    return found


def command_options() -> str:
    """Every subcommand's arguments and options, one section each, from the CLI's parsers."""
    out = []
    for name, (parser, text) in command_parsers().items():
        out.append(f"### `otel-ttft {name}`\n\n{_cell(text)}.\n")
        out.append(_arguments_table(parser))
    return "\n".join(out)


def replay_options() -> str:
    """``otel-ttft replay``'s options, from its parser."""
    from otel_ttft.tools.cli import build_parser

    return _options_table(_subcommands(build_parser())["replay"][0])


def check_options() -> str:
    from otel_ttft.tools.cli import build_parser

    return _options_table(_subcommands(build_parser())["check"][0])


def _first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    return re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0]


def modules() -> list[tuple[str, str]]:
    """(path, first sentence of its docstring) of every module of the package, read without
    importing it (the runtime's hook modules import vLLM's)."""
    root = Path(semconv.__file__).resolve().parents[1]
    out = []
    for path in sorted(root.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out.append((path.relative_to(root.parent).as_posix(), _first_sentence(doc)))
    return out


def modules_table() -> str:
    """Every module of ``otel_ttft`` with what it holds, layer by layer."""
    def layer(path: str) -> int:
        for i, prefix in enumerate(("otel_ttft/semconv/", "otel_ttft/diagnosis/",
                                    "otel_ttft/runtime/", "otel_ttft/tools/")):
            if path.startswith(prefix):
                return i + 1
        return 0
    rows = [(_code(path), text) for path, text in sorted(modules(), key=lambda m: (layer(m[0]),
                                                                                   m[0]))]
    return _table(("module", "what it holds"), rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "modules": modules_table,
    "stages": stages_table,
    "vllm-spans": vllm_spans_table,
    "names": names_tables,
    "settings": settings_table,
    "analysis-schema": analysis_schema,
    "commands": commands_table,
    "command-options": command_options,
    "replay-options": replay_options,
    "check-options": check_options,
}


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- reference: NAME -->`` line replaced by its table;
    ``ValueError`` on a name no generator has (a strict docs build fails on it)."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown reference table {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]().rstrip("\n")

    return MARKER.sub(replace, markdown)
