"""``otel-ttft forecast``: what each model's next first token will cost on this host, before any
start, as a table or JSON (what a router or a swapper reads to pick the model to evict).

Reads the live verdict's history (the same file the servers write), the checkpoint's page-cache
residency (mincore, never its bytes), the compile cache, the running servers and the device
memory (``runtime/hooks/forecast_conditions``), and applies the pure model
(``otel_ttft.diagnosis.forecast``). A history that cannot be read (garbage, truncated, foreign,
too large, not a regular file) is one line and exit 2; a missing one means "no history".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from otel_ttft import semconv
from otel_ttft.diagnosis import forecast as model
from otel_ttft.runtime import activation_history as history
from otel_ttft.runtime import history_storage
from otel_ttft.runtime.hooks import forecast_conditions as conditions
from otel_ttft.tools import safe_io

SCHEMA = "otel-ttft-forecast/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--history", default=None,
                   help="the activation history (default: where the servers keep it: "
                        "OTEL_TTFT_VERDICT_HISTORY, else $VLLM_CACHE_ROOT/otel-ttft/"
                        "activations.json)")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="only this model (served name or checkpoint; repeat for more); a model "
                        "never started here says \"no history\"")
    p.add_argument("--from", dest="outgoing", default=None, metavar="MODEL",
                   help="the model whose server must leave first (default: a running vLLM "
                        "server of another model on this host, if any)")
    p.add_argument("--alone", action="store_true",
                   help="forecast as if no server had to leave first (ignore running servers)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="write the forecasts as JSON to PATH ('-' for stdout: no table)")
    p.add_argument("--no-device", action="store_true",
                   help="do not ask nvidia-smi which processes hold the GPU's memory")


def document(records: Sequence[dict], host: conditions.Host, *, only: Sequence[str] = (),
             outgoing: str | None = None, alone: bool = False,
             source: str = "") -> dict[str, Any]:
    found = conditions.forecasts(records, host, only=only, outgoing=outgoing, alone=alone)
    return {"schema": SCHEMA, "history": source,
            "running": [{"pid": s.pid, "names": list(s.names)} for s in host.servers],
            "forecasts": [f.as_dict() for f in found]}


def forecast_for(model_name: str, *, outgoing: str | None = None, path: str | None = None,
                 empty_compile_cache: bool = False, alone: bool = False) -> dict[str, Any]:
    """One model's forecast as JSON-ready data (the replay records it before a switch: it knows
    which model leaves, ``outgoing``, ``None`` for none, and when it will start the model with an
    empty compile cache); a history that cannot be read gives "no history" with the reason."""
    where = path or history_storage.where()["path"]
    loaded = history.load(Path(where)) if where else history.Loaded()
    host = conditions.read_host(device=False)
    if loaded.problem:
        doc = model.no_history(model_name).as_dict()
        doc["basis"] = [f"history not read: {loaded.problem}"]
        return doc
    probe = (lambda _record: False) if empty_compile_cache else conditions.compile_cache_dir_holds
    (found,) = conditions.forecasts(loaded.records, host, only=[model_name], outgoing=outgoing,
                                    alone=alone or outgoing is None, compile_probe=probe)
    return found.as_dict()


def run(args: argparse.Namespace) -> int:
    try:
        output = None if args.json is None else safe_io.Output(
            args.json, inputs=[args.history] if args.history else [])
    except safe_io.OutputError as exc:
        print(f"otel-ttft forecast: {exc}", file=sys.stderr)
        return 2
    where = args.history or history_storage.where()["path"]
    loaded = history.load(Path(where))
    if loaded.problem:
        print(f"otel-ttft forecast: {loaded.problem}", file=sys.stderr)
        return 2
    host = conditions.read_host(device=not args.no_device)
    doc = document(loaded.records, host, only=args.model, outgoing=args.outgoing,
                   alone=args.alone, source=where)
    if output is not None:
        try:
            output.write(json.dumps(doc, indent=1, allow_nan=False) + "\n")
        except (safe_io.OutputError, ValueError) as exc:
            print(f"otel-ttft forecast: {exc}", file=sys.stderr)
            return 2
        if output.is_stdout:
            return 0
    print_table(doc, sys.stdout)
    if output is not None:
        print(f"wrote {output}")
    return 0


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def print_table(doc: dict, out: TextIO) -> None:
    """One block per model: total and range, each stage, the basis in words."""
    if not doc["forecasts"]:
        out.write(f"no activation recorded in {doc['history']} yet: no model has a forecast\n")
        return
    for f in doc["forecasts"]:
        if f["status"] == model.NO_HISTORY:
            out.write(f"{f['model']}: no history ({'; '.join(f['basis'])})\n\n")
            continue
        out.write(f"{f['model']}: {_s(f['total_s'])} (range {_s(f['low_s'])} .. "
                  f"{_s(f['high_s'])}; largest stage {f['largest_stage']})\n")
        for stage, s in f["stages"].items():
            out.write(f"  {stage:<24}{_s(s['expected_s']):>12}\n")
            for sub, v in f["substages"].items():
                if semconv.stage_family(sub) == stage and v["expected_s"] >= 0.005:
                    out.write(f"    {sub:<22}{_s(v['expected_s']):>12}\n")
        for line in f["basis"] + f["conditions"]["notes"]:
            out.write(f"  - {line}\n")
        out.write("\n")
