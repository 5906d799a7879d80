"""``otel-ttft``: a thin dispatcher; each subcommand's logic lives in its own module."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from otel_ttft.tools import cliargs, foreground, safe_io


def _sink(args: argparse.Namespace) -> int:
    from otel_ttft.tools.sink.receiver import OTLPReceiver, check_bind_host
    from otel_ttft.tools.sink.store import SpanStore

    grpc_port = None if args.grpc_port < 0 else args.grpc_port
    try:  # every argument before the store directory is touched
        check_bind_host(args.host, allow_non_loopback=args.allow_non_loopback)
    except ValueError as exc:
        print(f"otel-ttft sink: {exc}", file=sys.stderr)
        return 2
    if hasattr(signal, "SIGXFSZ"):  # over a file-size limit: a failed write (503), not death
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _raise_descriptor_limit()
    created = _created_by(Path(args.dir))
    try:
        receiver = OTLPReceiver(SpanStore(args.dir), args.host, args.http_port, grpc_port,
                                allow_non_loopback=args.allow_non_loopback).start()
    except (OSError, ValueError) as exc:  # a port in use, an unusable store: leave no trace
        _remove_created(created)
        print(f"otel-ttft sink: {exc}", file=sys.stderr)
        return 2
    print(f"OTLP/HTTP  {receiver.http_endpoint}  (/v1/traces, /v1/metrics)")
    if grpc_port is not None:
        print(f"OTLP/gRPC  {receiver.grpc_endpoint}")
    print(f"storing into {Path(args.dir).resolve()}; Ctrl-C to stop", flush=True)
    try:
        foreground.wait_for_stop()
    finally:
        receiver.stop()
    return 0


def _created_by(directory: Path) -> list[Path]:
    """What opening a store in ``directory`` would create: the missing directories (deepest
    last) and, when there is no database yet, its files."""
    from otel_ttft.tools.sink.store import DB_FILE

    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    files = [] if (directory / DB_FILE).exists() else [
        directory / (DB_FILE + suffix) for suffix in ("", "-wal", "-shm", "-journal")]
    return [*files, *missing]


def _remove_created(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            if path.is_dir():
                path.rmdir()  # only when empty: something else put files there
            else:
                path.unlink(missing_ok=True)


def _raise_descriptor_limit() -> None:
    """One descriptor per exporter connection: take the hard limit, not the soft default."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def _export(args: argparse.Namespace) -> int:
    """Valid OTLP/JSON or nothing: the target is checked first, every span on the way out, and
    the file replaces the target only once the last span is written."""
    from otel_ttft.tools.analysis.traces import TraceFileError, iter_traces
    from otel_ttft.tools.sink.otlp_encode import ExportError, write_lines

    try:
        output = _output(args.output, args.path)
        with output.open() as f:
            count = write_lines(iter_traces(args.path), f)
    except (TraceFileError, safe_io.OutputError) as exc:
        print(f"otel-ttft export: {exc}", file=sys.stderr)
        return 2
    except ExportError as exc:
        print(f"otel-ttft export: {args.path}: {exc}; nothing written", file=sys.stderr)
        return 2
    print(f"{count} spans written to {output} (OTLP/JSON, one export request per line)",
          file=sys.stderr if output.is_stdout else sys.stdout)
    return 0


def _output(target: str, *inputs: str, allow_stdout: bool = True) -> safe_io.Output:
    """The output rule (``safe_io``) for a command's file argument; a store directory among the
    inputs protects its database files too."""
    from otel_ttft.tools.sink.db import STORE_FILES

    return safe_io.Output(target, inputs=inputs, reserved=STORE_FILES,
                          allow_stdout=allow_stdout)


def _tree(args: argparse.Namespace) -> int:
    """Streams trace by trace (bounded memory over a store): each trace's activation and request
    trees; when the input has neither, every tree."""
    from otel_ttft.tools.analysis.traces import TraceFileError, iter_traces
    from otel_ttft.tools.analysis.tree import tree_roots

    wanted = args.trace.lower() if args.trace else None
    printed = 0
    fallback: list[object] = []  # roots of plain traces, printed only if nothing else is
    too_many = False
    try:
        for spans in iter_traces(args.path, trace_id=wanted):
            picked, plain = tree_roots(spans)
            for root in picked:
                printed += _print_tree(root, args.max_depth, printed)
            if not printed and not too_many:
                fallback.extend(plain)
                too_many = len(fallback) > 10_000
                if too_many:
                    fallback.clear()
        if not printed and too_many:  # no activation anywhere: a second pass for plain trees
            fallback = [r for spans in iter_traces(args.path) for r in tree_roots(spans)[1]]
        if not printed:
            for root in sorted(fallback, key=lambda r: r.start_ns):
                printed += _print_tree(root, args.max_depth, printed)
        if printed:
            sys.stdout.write("\n")  # the last line ends like every other
    except TraceFileError as exc:
        print(f"otel-ttft tree: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    if not printed:
        what = f"no spans of trace {args.trace}" if wanted else "no spans"
        print(f"otel-ttft tree: {what} in {args.path}", file=sys.stderr)
        return 2
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from otel_ttft.tools.analysis.analyze import AnalysisError, analyze
    from otel_ttft.tools.analysis.breakdown import collect
    from otel_ttft.tools.analysis.render import print_analysis
    from otel_ttft.tools.analysis.source import SourceError, is_url, iter_traces

    try:  # the output rule first: a refusal costs nothing
        output = None if args.json is None else _output(
            args.json, *(() if is_url(args.source) else (args.source,)))
        collected = collect(iter_traces(args.source, since_s=args.since, limit=args.limit,
                                        timeout_s=args.timeout))
        doc = analyze(collected, baseline=args.baseline, run_id=args.run, source=args.source,
                      segments=output is not None)  # the table does not draw them
    except (SourceError, AnalysisError, safe_io.OutputError) as exc:
        print(f"otel-ttft analyze: {exc}", file=sys.stderr)
        return 2
    if not doc["requests"] and not doc["errors"]:
        print(f"otel-ttft analyze: no requests with a first token in {args.source} "
              f"({collected.spans} spans read)", file=sys.stderr)
        return 2
    if output is not None:  # first: a reader that stops reading the table must not cost the file
        try:
            write_json(output, doc)
        except (safe_io.OutputError, ValueError) as exc:
            print(f"otel-ttft analyze: {exc}", file=sys.stderr)
            return 2
        if output.is_stdout:  # the document is the output; the table would corrupt it
            return 0
    print_analysis(doc, sys.stdout)
    if output is not None:
        print(f"wrote {output}")
    return 0


def write_json(output: safe_io.Output | str | Path, doc: dict) -> None:
    """Whole or not at all (the output rule, ``safe_io``); ValueError for a value JSON cannot
    hold (NaN), before anything is written."""
    import json

    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    target = output if isinstance(output, safe_io.Output) else safe_io.Output(output)
    target.write(text)


def _print_tree(root: object, max_depth: int | None, printed: int) -> int:
    from otel_ttft.tools.analysis.tree import render_tree

    sys.stdout.write(("\n\n" if printed else "") + render_tree(root, max_depth=max_depth))
    return 1


def _demo(args: argparse.Namespace) -> int:
    from otel_ttft.tools.replay.demo import run_demo

    return run_demo(args.out, keep_going=args.keep_going, analyze=_analyze_and_report,
                    verify=_verify_and_report)


def _verify_and_report(analysis: Path, out: Path, report: Path,
                       scenarios: Sequence[tuple[str, str]]) -> int:
    """The demo's last step: try the changes it can on this machine, then draw them."""
    argv = ["verify", str(analysis), "--out", str(out), "--max-tries", "1", "--brief"]
    for scenario, candidate in scenarios:
        argv += ["--scenario", scenario, "--candidate", f"{scenario}={candidate}"]
    rc = main(argv)
    verified = out / "analysis.json"
    if verified.exists():
        report_rc = main(["report", str(verified), "-o", str(report)])
        rc = rc or report_rc
    return rc


def _verify(args: argparse.Namespace) -> int:
    from otel_ttft.tools.replay.verify import main as verify_main

    return verify_main(args)


def _analyze_and_report(store: Path, analysis: Path, report: Path) -> int:
    """The demo's main job on what its replay stored: breakdown and verdicts, then the page."""
    rc = main(["analyze", str(store), "--json", str(analysis)])
    if rc == 0:
        rc = main(["report", str(analysis), "-o", str(report)])
    return rc


def _report(args: argparse.Namespace) -> int:
    from otel_ttft.tools.analysis.contract import AnalysisFileError, load_analysis
    from otel_ttft.tools.analysis.report import ReportError, write_report

    try:
        output = _output(args.output, args.analysis)
        write_report(load_analysis(args.analysis), output)
    except (AnalysisFileError, ReportError, safe_io.OutputError) as exc:
        print(f"otel-ttft report: {exc}", file=sys.stderr)
        return 2
    if not output.is_stdout:
        print(f"wrote {output}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from otel_ttft.tools.analysis.check import ThresholdError, build_thresholds, run_check
    from otel_ttft.tools.analysis.contract import AnalysisFileError, load_analysis

    try:
        thresholds = build_thresholds(args.max_growth, args.min_delta_s, args.stage,
                                      args.thresholds)
        current, baseline = load_analysis(args.current), load_analysis(args.baseline)
    except (AnalysisFileError, ThresholdError) as exc:
        print(f"otel-ttft check: {exc}", file=sys.stderr)
        return 2
    return run_check(current, baseline, thresholds,
                     allow_different_runs=args.allow_different_runs)
def _replay(args: argparse.Namespace) -> int:
    from otel_ttft.tools.replay.command import main

    return main(args)


def _prometheus(args: argparse.Namespace) -> int:
    from otel_ttft.tools.prom import serve

    return serve.main(args)


def _doctor(argv: Sequence[str]) -> int:
    from otel_ttft.tools import doctor

    return int(doctor.main(list(argv)) or 0)


def forecast_arguments(p: argparse.ArgumentParser) -> None:
    from otel_ttft.tools import forecast

    forecast.add_arguments(p)


def _forecast(args: argparse.Namespace) -> int:
    from otel_ttft.tools import forecast

    return forecast.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = cliargs.Parser(
        prog="otel-ttft", description="Split vLLM time-to-first-token into named stages.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="replay the six switch scenarios on two tiny local models "
                                    "against real traced vLLM; print the breakdown and verdicts")
    p.add_argument("--out", default="out/demo", type=cliargs.work_dir,
                   help="where telemetry is stored (out/demo)")
    p.add_argument("--keep-going", action="store_true",
                   help="a failed request does not end or fail the demo (the analysis still "
                        "runs, on what arrived), as long as the servers came up and telemetry "
                        "arrived")
    p.set_defaults(func=_demo)

    p = sub.add_parser("sink", help="run the embedded OTLP receiver into a local store")
    p.add_argument("--dir", required=True, type=cliargs.work_dir,
                   help="store directory (telemetry.db); created if missing")
    p.add_argument("--host", default="127.0.0.1",
                   help="address both receivers listen on (127.0.0.1; another needs "
                        "--allow-non-loopback)")
    p.add_argument("--http-port", type=cliargs.port(0), default=4318,
                   help="OTLP/HTTP port (4318); 0 picks a free port")
    p.add_argument("--grpc-port", type=cliargs.port(-1), default=4317,
                   help="OTLP/gRPC port (4317); 0 picks a free port, -1 disables gRPC")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="accept unauthenticated writes from other hosts")
    p.set_defaults(func=_sink)

    p = sub.add_parser("tree", help="render span trees from a store dir, spans.jsonl or OTLP JSON")
    p.add_argument("path", help="store dir, telemetry.db, spans.jsonl or OTLP/JSON")
    p.add_argument("--trace", help="only this trace id (32 hex; default: every trace)")
    p.add_argument("--max-depth", type=cliargs.non_negative_int, default=None,
                   help="print spans at most this deep below each root (0: the roots alone; "
                        "default: all)")
    p.set_defaults(func=_tree)

    p = sub.add_parser("analyze", help="split each first token into stages and name the stage "
                                       "to fix")
    p.add_argument("source", help="store directory, spans .jsonl / OTLP JSON file, or a Tempo "
                                  "base URL (http://tempo:3200)")
    p.add_argument("--json", metavar="FILE", help="also write the analysis (otel-ttft/analysis/v1)"
                   "; '-': only the JSON, to stdout")
    p.add_argument("--baseline", help="scenario to compare against (default: short-prompt, or "
                                      "MODEL:warm for live traffic)")
    p.add_argument("--run", help="only this replay run id (needed when runs differ)")
    p.add_argument("--since", type=cliargs.positive(float), default=None,
                   help="Tempo: search the last N seconds (default 86400)")
    p.add_argument("--limit", type=cliargs.positive(int), default=None,
                   help="Tempo: at most N traces (default 5000)")
    p.add_argument("--timeout", type=cliargs.seconds, default=None, metavar="S",
                   help="Tempo: give up on an answer not complete after S seconds (default 30)")
    p.set_defaults(func=_analyze)

    p = sub.add_parser("report", help="write a self-contained HTML report from an analysis.json")
    p.add_argument("analysis", metavar="ANALYSIS_JSON",
                   help="written by `otel-ttft analyze --json` (and `verify`)")
    p.add_argument("-o", "--output", default="report.html",
                   help="HTML file (report.html); '-' for stdout")
    p.set_defaults(func=_report)

    p = sub.add_parser("check", help="exit 1 when a stage median grew against a baseline run",
                       description="Compare per-scenario stage and substage p50s of two "
                       "analysis.json files. A stage fails when it grew by more than "
                       "max(MIN_DELTA_S, RATIO * baseline p50).")
    p.add_argument("current", metavar="CURRENT", help="analysis.json of the candidate")
    p.add_argument("baseline", metavar="BASELINE", help="analysis.json of the accepted run")
    p.add_argument("--max-growth", default=None, metavar="RATIO",
                   help="default allowed growth as a ratio of the baseline p50 (0.25)")
    p.add_argument("--min-delta-s", default=None, metavar="S",
                   help="growth below this many seconds never fails (0.05)")
    p.add_argument("--stage", action="append", default=[], metavar="STAGE=RATIO",
                   help="per-stage ratio, e.g. load=0.5 or warmup.compile=1.0 (repeatable)")
    p.add_argument("--thresholds", metavar="TOML",
                   help="file with max_growth, min_delta_s and a [stages] table")
    p.add_argument("--allow-different-runs", action="store_true",
                   help="compare even when client, sampling, concurrency or prompts differ")
    p.set_defaults(func=_check)

    p = sub.add_parser("verify", help="try each verdict's concrete change through the same "
                       "replay and measure it against the same baseline")
    from otel_ttft.tools.replay.verify import add_arguments as add_verify_arguments

    add_verify_arguments(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser("export", help="write a store's spans as OTLP/JSON (file exporter format)")
    p.add_argument("path", help="store dir, telemetry.db, spans.jsonl or OTLP/JSON")
    p.add_argument("-o", "--output", required=True, help="file to write ('-' for stdout)")
    p.set_defaults(func=_export)

    p = sub.add_parser("replay", help="replay the switch scenarios against real servers, traced")
    from otel_ttft.tools.replay.command import add_arguments as add_replay_arguments

    add_replay_arguments(p)
    p.set_defaults(func=_replay)

    p = sub.add_parser("prometheus", help="serve a store's metrics for Prometheus to scrape (the "
                       "Collector's names), or write them as OpenMetrics for backfilling")
    p.add_argument("--dir", required=True, type=cliargs.existing_dir,
                   help="store directory written by `otel-ttft sink`")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1; another needs --allow-non-loopback)")
    p.add_argument("--port", type=cliargs.port(0), default=9464,
                   help="0 picks a free port (9464)")
    p.add_argument("--expire", type=cliargs.finite_float, default=1800,
                   help="drop series not updated for this many seconds (1800; 0 keeps all)")
    p.add_argument("--openmetrics", metavar="FILE",
                   help="write every point with its timestamp to FILE ('-' for stdout) and exit")
    p.add_argument("--shift", type=cliargs.finite_float, default=0.0,
                   help="with --openmetrics: add this many seconds to every timestamp")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="listen on a non-loopback address")
    p.set_defaults(func=_prometheus)

    p = sub.add_parser("forecast", help="what each model's next first token will cost on this "
                                        "host, stage by stage, before any start")
    forecast_arguments(p)
    p.set_defaults(func=_forecast)

    sub.add_parser("doctor", add_help=False, help="which hooks are live for the installed vLLM")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "doctor":  # its options are its own
        return _doctor(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, exit 2) or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    previous = _exit_on_sigterm() if args.command in _FILE_COMMANDS else None
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a full device shows here, not in the interpreter's exit
        return rc
    except BrokenPipeError:  # `otel-ttft ... | head`: the reader left; no traceback
        _stdout_to_devnull()
        return 1
    except OSError as exc:
        return _stdout_failed(f"otel-ttft {args.command}", exc)
    except MemoryError:  # an address-space limit (ulimit -v) or overcommit off
        print(f"otel-ttft {args.command}: out of memory (a ulimit -v or the machine's memory); "
              "read a smaller input or allow more", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stdout_failed(prog: str, exc: OSError) -> int:
    """A full device under what the command printed (`> /dev/full`; files of ours are named by
    ``safe_io``): one line, exit 2. Any other error is not ours to word."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise exc
    where = None if exc.filename is None else Path(os.fsdecode(exc.filename)).parent
    _stdout_to_devnull()
    print(f"{prog}: {'stdout' if where is None else os.fsdecode(exc.filename)}: "
          f"{safe_io.write_failure(exc, where)}", file=sys.stderr)
    return 2


def _stdout_to_devnull() -> None:
    """What is left in stdout's buffer goes nowhere (the reader left, or the device is full),
    so the interpreter's own flush at exit has nothing to complain about."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


# Commands that read and write files: SIGTERM unwinds them like Ctrl-C, so a temporary output
# file is removed (safe_io) instead of left behind by the default, immediate death.
_FILE_COMMANDS = frozenset({"tree", "analyze", "report", "check", "export", "prometheus"})


def _exit_on_sigterm():
    """Install the SIGTERM handler (main thread only); returns the one it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, terminate)


if __name__ == "__main__":
    sys.exit(main())
