"""The analysis as terminal text: one breakdown table per scenario first, then the verdicts."""

from __future__ import annotations

import os
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table

from otel_ttft.tools.analysis.breakdown import PIPELINE
from otel_ttft.tools.analysis.tree import format_duration


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return "·" if value == 0 else format_duration(value)


def _model(name: object) -> str:
    """A model given as a local path reads as its directory name."""
    return os.path.basename(str(name).rstrip("/")) or str(name)


MAX_ROWS = 12  # per scenario table: the slowest requests; the JSON has every one


def print_analysis(doc: dict, out: TextIO, *, width: int | None = None,
                   max_rows: int = MAX_ROWS) -> None:
    console = Console(file=out, width=width or 150, highlight=False, soft_wrap=False,
                      force_terminal=False, color_system=None)
    run = doc.get("run") or {}
    if run.get("run_id"):
        console.print(f"replay run {run['run_id']}: driver {run.get('driver')}, models "
                      f"{', '.join(map(str, run.get('models') or []))}, concurrency "
                      f"{run.get('concurrency')}, sampling {run.get('sampling')}")
    by_scenario: dict[str, list[dict]] = {}
    for r in doc["requests"]:
        by_scenario.setdefault(r["scenario"], []).append(r)
    for name, summary in doc["scenarios"].items():
        rows = by_scenario.get(name, [])
        hidden = max(0, len(rows) - max_rows)
        if hidden:  # the slowest, in time order
            slowest = sorted(rows, key=lambda r: r["client_ttft_s"], reverse=True)[:max_rows]
            keep = {id(r) for r in slowest}
            rows = [r for r in rows if id(r) in keep]
        table = Table(title=f"{name}  (n={summary['n']}, client TTFT p50 "
                            f"{_seconds(summary['ttft_p50_s'])})", title_justify="left",
                      box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("request", no_wrap=True)
        table.add_column("model", no_wrap=True, overflow="ellipsis", max_width=24)
        table.add_column("tokens", justify="right", no_wrap=True)
        table.add_column("TTFT", justify="right", no_wrap=True)
        for stage in PIPELINE:
            table.add_column(stage, justify="right", no_wrap=True)
        table.add_column("largest sub-stage", no_wrap=True)
        for r in rows:
            top = max(r["substages"].items(), key=lambda kv: kv[1], default=None)
            table.add_row(
                r["trace_id"][:8], _model(r["model"]), str(r["prompt_tokens"] or "-"),
                _seconds(r["client_ttft_s"]), *(_seconds(r["stages"][s]) for s in PIPELINE),
                f"{top[0]} {_seconds(top[1])}" if top else "-")
        table.add_section()
        if hidden:
            table.add_row(f"+{hidden}", "faster", "", "", *([""] * len(PIPELINE)),
                          "requests not shown")
        table.add_row("p50", "", "", _seconds(summary["ttft_p50_s"]),
                      *(_seconds(summary["stages_p50"][s]) for s in PIPELINE), "")
        console.print(table)
    if doc.get("ignored_requests"):
        console.print(f"({doc['ignored_requests']} requests outside the replay's scenarios, e.g. "
                      "its warm-up requests, are not counted)")
    for error in doc.get("errors") or []:
        console.print(f"failed request {error['trace_id'][:8]} ({error['scenario']}): "
                      f"{error['error']}")
    if not doc["verdicts"]:
        console.print("no verdicts: no baseline scenario to compare with (replay a warm "
                      "short prompt, or pass --baseline)")
    console.print("")
    console.print("Verdicts (earliest stage that expanded against the baseline):")
    for v in doc["verdicts"]:
        console.print(f"- {v.get('summary') or v['scenario']}")
        note = (v.get("evidence") or {}).get("note")
        if note:
            console.print(f"    note: {note}")
        _print_change(console, v.get("change"))
    gated = doc.get("gated_activations") or []
    if gated:
        console.print("")
        console.print("Starts along their slowest worker rank (one rank fell behind the others):")
    for g in gated:
        console.print(f"- {g['kind']} {g['trace_id'][:8]}"
                      + (f" of {_model(g['model'])}" if g.get("model") else "")
                      + f" ({_seconds(g['duration_s'])}): {g['summary']}")


def _print_change(console: Console, change: dict | None) -> None:
    """The verdict's concrete change: every candidate, in the order `verify` tries them."""
    if not change or not change.get("candidates"):
        return
    from otel_ttft.tools.analysis.change import change_lines

    console.print(f"    change (vLLM {change.get('vllm') or 'not read'}):", markup=False)
    for i, c in enumerate(change_lines(change), 1):
        console.print(f"      {i}. {c['change']}" + (f"  [{c['notes']}]" if c["notes"] else ""),
                      markup=False)
        console.print(f"         {c['reason']}", markup=False)
