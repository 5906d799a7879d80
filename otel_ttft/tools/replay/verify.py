"""``otel-ttft verify ANALYSIS``: try each verdict's concrete change and measure it.

For every verdict with a change, the scenario is re-run through the replay with the same models,
prompts, sampling, client, concurrency, repeats, driver and command templates (all recorded on
the original run's ``replay.run`` span, ``run.setup`` in the analysis) and only the change
applied; the new run is analyzed against the *same* baseline requests, and the result recorded
under ``verifications``: before and after TTFT p50, the noise, the blamed stage before and
after, the new verdict, and ``verified`` = the TTFT fell beyond the noise **and** the blamed stage
shrank (by more than its own noise and 10 % of what it was). A change that does not help is
reported, with its numbers, and the next candidate is tried, up to ``--max-tries`` per verdict.
A change that cannot be tried here (sleep mode or CUDA graphs without a GPU, a client-side
change, a knob the installed vLLM lacks, servers given by URL) is listed as not tried, and why.

``verify`` runs the server commands the analysis recorded (``run.setup``), as ``replay`` runs
the templates it is given: verify analyses of your own replays, not files from strangers.

The original run's files are only read: the re-runs go to a store of their own under ``--out``
and the result to ``--json`` (never the input file). Exit 0: every change that could be tried
was measured; 1: a re-run failed (recorded, with its one-line reason); 2: bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from otel_ttft import semconv
from otel_ttft.tools import safe_io
from otel_ttft.tools.analysis import knobs
from otel_ttft.tools.analysis.contract import MAX_FILE_BYTES, AnalysisFileError, load_analysis
from otel_ttft.tools.analysis.verification import STATUS_FAILED, print_verifications
from otel_ttft.tools.replay import setup as replay_setup
from otel_ttft.tools.replay.verify_run import MAX_TRIES, Options, Runner, wanted

OUT_FILE = "analysis.json"
STORE_DIR = "store"


class VerifyError(ValueError):
    """The input cannot be verified as given: exit 2 with this one line."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("analysis", metavar="ANALYSIS_JSON", help="written by `otel-ttft analyze "
                   "--json` from a replay run")
    p.add_argument("--out", help="where the re-runs' store and server logs go (default: "
                   "verify/ beside ANALYSIS_JSON)")
    p.add_argument("--json", metavar="FILE", help="the analysis with its verifications "
                   "(default: OUT/analysis.json; never ANALYSIS_JSON itself)")
    p.add_argument("--scenario", action="append", default=[],
                   help="only this scenario's verdict (repeatable; default: every verdict)")
    p.add_argument("--candidate", action="append", default=[], metavar="[SCENARIO=]ID",
                   help="only changes of this kind (compile-cache, resident, kv-budget, ...), "
                        "for every scenario or one; repeatable; default: all, in order")
    p.add_argument("--max-tries", default=str(MAX_TRIES),
                   help=f"re-runs per verdict (default {MAX_TRIES})")
    p.add_argument("--start-timeout", default=None,
                   help="s for a server to become healthy (default: the replay's)")
    p.add_argument("--brief", action="store_true",
                   help="print only the verification lines (the table and the changes are "
                        "what `analyze` printed)")


def _options(args: argparse.Namespace) -> Options:
    analysis = Path(args.analysis)
    out = Path(args.out) if args.out else analysis.parent / "verify"
    json_out = Path(args.json) if args.json else out / OUT_FILE
    try:
        tries = int(args.max_tries)
    except ValueError:
        raise VerifyError(f"--max-tries must be an integer, not {args.max_tries!r}") from None
    if not 1 <= tries <= 10:
        raise VerifyError("--max-tries must be 1..10")
    timeout = None
    if args.start_timeout is not None:
        try:
            timeout = float(args.start_timeout)
        except ValueError:
            raise VerifyError(f"--start-timeout must be a number, not "
                              f"{args.start_timeout!r}") from None
        if not 0 < timeout < 1e6:
            raise VerifyError("--start-timeout must be > 0 s")
    if _same(json_out, analysis):
        raise VerifyError(f"--json {json_out} is the input: the original analysis is never "
                          "overwritten")
    if args.json == safe_io.STDOUT or json_out.parent.is_dir():  # else made with --out
        try:  # the output rule before anything runs: not a device, a directory, the input
            safe_io.Output(json_out if args.json != safe_io.STDOUT else args.json,
                           inputs=[str(analysis)], allow_stdout=False)
        except safe_io.OutputError as exc:
            raise VerifyError(f"--json {exc}") from None
    return Options(analysis, out, json_out, tuple(args.scenario), tries, timeout,
                   bool(getattr(args, "brief", False)), tuple(getattr(args, "candidate", ())))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def main(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    out = stream or sys.stdout
    try:
        return _main(_options(args), out)
    except VerifyError as exc:
        print(f"otel-ttft verify: {exc}", file=sys.stderr)
        return 2


def run_argv(argv: Sequence[str], stream: TextIO | None = None) -> int:
    """For the demo and tests: ``otel-ttft verify`` with these arguments."""
    parser = argparse.ArgumentParser(prog="otel-ttft verify")
    add_arguments(parser)
    return main(parser.parse_args(list(argv)), stream)


# --- reading the input ------------------------------------------------------------------------
def _load(path: Path) -> dict:
    try:
        load_analysis(path)  # the contract: every field typed and bounded, one line on a defect
        return json.loads(safe_io.read_bytes(path, MAX_FILE_BYTES, "an analysis.json"))
    except (AnalysisFileError, safe_io.InputError) as exc:
        raise VerifyError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise VerifyError(f"{path}: cannot read: {exc}") from None


def _setup(doc: dict, path: Path) -> dict:
    setup = (doc.get("run") or {}).get("setup")
    if not isinstance(setup, dict):
        raise VerifyError(f"{path}: no replay setup (run.setup): not a replay run, or one "
                          "recorded before `verify` existed; replay it again and analyze that")
    if setup.get("version") != replay_setup.SETUP_VERSION:
        raise VerifyError(f"{path}: replay setup version {setup.get('version')!r}, this "
                          f"otel-ttft reads {replay_setup.SETUP_VERSION}")
    targets = setup.get("targets")
    if not isinstance(targets, list) or len(targets) != 2 or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in targets):
        raise VerifyError(f"{path}: run.setup.targets must name the replay's two models")
    for key in ("repeat", "concurrency", "max_tokens", "seed", "max_model_len"):
        if not isinstance(setup.get(key), int) or isinstance(setup.get(key), bool):
            raise VerifyError(f"{path}: run.setup.{key} must be an integer")
    if setup.get("driver") not in semconv.DRIVERS:
        raise VerifyError(f"{path}: run.setup.driver {setup.get('driver')!r} is not a driver")
    for i, t in enumerate(targets):
        for key in ("template", "model", "url"):
            if t.get(key) is not None and not isinstance(t.get(key), str):
                raise VerifyError(f"{path}: run.setup.targets.{i}.{key} must be a string")
    return setup


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_candidates(doc: dict, path: Path) -> None:
    """Every candidate well-formed before anything runs: lists of strings, names of variables."""
    for i, v in enumerate(doc.get("verdicts") or []):
        for j, c in enumerate((v.get("change") or {}).get("candidates") or []):
            where = f"{path}: verdicts.{i}.change.candidates.{j}"
            if not isinstance(c, dict) or not isinstance(c.get("id"), str):
                raise VerifyError(f"{where}: expected an object with an id")
            for key in ("args", "models", "durable", "missing"):
                value = c.get(key, [])
                if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                    raise VerifyError(f"{where}.{key}: expected a list of strings")
            env = c.get("env", {})
            if not isinstance(env, dict) or not all(
                    isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(x, str)
                    for k, x in env.items()):
                raise VerifyError(f"{where}.env: expected NAME: string pairs")
            if c.get("stage") is not None and not isinstance(c.get("stage"), str):
                raise VerifyError(f"{where}.stage: expected a stage name")
            if c.get("driver") not in (None, *semconv.DRIVERS):
                raise VerifyError(f"{where}.driver: {str(c.get('driver'))[:40]!r} is not a driver")


# --- the run ------------------------------------------------------------------------------------
def _main(opts: Options, out: TextIO) -> int:
    doc = _load(opts.analysis)
    setup = _setup(doc, opts.analysis)
    _check_candidates(doc, opts.analysis)
    verdicts = [v for v in doc.get("verdicts") or []
                if not opts.scenarios or v["scenario"] in opts.scenarios]
    unknown = [s for s in opts.scenarios if s not in {v["scenario"] for v in doc["verdicts"]}]
    if unknown:
        raise VerifyError(f"no verdict for scenario {unknown[0]!r} in {opts.analysis}")
    if not any(wanted(v, opts) for v in verdicts):
        raise VerifyError(f"{opts.analysis}: no verdict with a concrete change to verify"
                          + (f" of kind {', '.join(opts.candidates)}" if opts.candidates else ""))
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VerifyError(f"--out {opts.out}: {exc.strerror or exc}") from None
    vocab, why = knobs.try_vocabulary()
    from otel_ttft.tools.sink.child import ReceiverProcess
    from otel_ttft.tools.sink.store import STORE_FILES

    store_dir = opts.out / STORE_DIR
    for name in STORE_FILES:  # a previous verify's store: these runs start a fresh one
        with contextlib.suppress(FileNotFoundError):
            (store_dir / name).unlink()
    records = []
    # The receiver in a process of its own, as in the demo: the runs' client TTFT is timed here.
    with ReceiverProcess(store_dir) as receiver:
        runner = Runner(doc, setup, opts, receiver.http_endpoint, receiver.store, vocab, why,
                        out)
        for v in verdicts:
            records += runner.verify(v)
    result = {**doc, "verifications": records}
    _write_json(opts.json_out, result)
    print_verifications(result, out, table=not opts.brief)
    print(f"wrote {opts.json_out}", file=out)
    return 1 if any(r["status"] == STATUS_FAILED for r in records) else 0


def _write_json(path: Path, doc: dict) -> None:
    """Whole or not at all, by the commands' output rule (``safe_io``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
        safe_io.Output(path, allow_stdout=False).write(text)
    except safe_io.OutputError as exc:
        raise VerifyError(str(exc)) from None
    except OSError as exc:
        raise VerifyError(f"cannot write {path}: {exc.strerror or exc}") from None
