"""``otel-ttft``: a thin dispatcher; each subcommand's logic lives in its own module."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path


def _sink(args: argparse.Namespace) -> int:
    from otel_ttft.sink.receiver import OTLPReceiver
    from otel_ttft.sink.store import SpanStore

    grpc_port = None if args.grpc_port < 0 else args.grpc_port
    if hasattr(signal, "SIGXFSZ"):  # over a file-size limit: a failed write (503), not death
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _raise_descriptor_limit()
    try:
        receiver = OTLPReceiver(SpanStore(args.dir), args.host, args.http_port, grpc_port,
                                allow_non_loopback=args.allow_non_loopback).start()
    except (OSError, ValueError) as exc:
        print(f"otel-ttft sink: {exc}", file=sys.stderr)
        return 2
    print(f"OTLP/HTTP  {receiver.http_endpoint}  (/v1/traces, /v1/metrics)")
    if grpc_port is not None:
        print(f"OTLP/gRPC  {receiver.grpc_endpoint}")
    print(f"storing into {Path(args.dir).resolve()}; Ctrl-C to stop", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0


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


def _port(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
        if not low <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}-65535")
        return value
    return parse


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _export(args: argparse.Namespace) -> int:
    from otel_ttft.analysis.traces import TraceFileError
    from otel_ttft.sink.otlp_encode import export_json

    try:
        count = export_json(args.path, args.output)
    except (TraceFileError, OSError) as exc:
        print(f"otel-ttft export: {exc}", file=sys.stderr)
        return 2
    print(f"{count} spans written to {args.output} (OTLP/JSON, one export request per line)")
    return 0


def _tree(args: argparse.Namespace) -> int:
    """Streams trace by trace (bounded memory over a store): each trace's activation and request
    trees; when the input has neither, every tree."""
    from otel_ttft.analysis.traces import TraceFileError, iter_traces
    from otel_ttft.analysis.tree import tree_roots

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
    from otel_ttft.analysis.analyze import AnalysisError, analyze
    from otel_ttft.analysis.breakdown import collect
    from otel_ttft.analysis.render import print_analysis
    from otel_ttft.analysis.source import SourceError, iter_traces

    try:
        collected = collect(iter_traces(args.source, since_s=args.since, limit=args.limit))
        doc = analyze(collected, baseline=args.baseline, run_id=args.run, source=args.source,
                      segments=bool(args.json))  # the table does not draw them
    except (SourceError, AnalysisError) as exc:
        print(f"otel-ttft analyze: {exc}", file=sys.stderr)
        return 2
    if not doc["requests"] and not doc["errors"]:
        print(f"otel-ttft analyze: no requests with a first token in {args.source} "
              f"({collected.spans} spans read)", file=sys.stderr)
        return 2
    if args.json:  # first: a reader that stops reading the table must not cost the file
        try:
            write_json(Path(args.json), doc)
        except OSError as exc:
            print(f"otel-ttft analyze: cannot write {args.json}: {exc}", file=sys.stderr)
            return 2
    print_analysis(doc, sys.stdout)
    if args.json:
        print(f"wrote {args.json}")
    return 0


def write_json(path: Path, doc: dict) -> None:
    """Whole or not at all: written beside the target, then renamed over it."""
    import json
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
        return value
    return parse
def _print_tree(root: object, max_depth: int | None, printed: int) -> int:
    from otel_ttft.analysis.tree import render_tree

    sys.stdout.write(("\n\n" if printed else "") + render_tree(root, max_depth=max_depth))
    return 1


def _demo(args: argparse.Namespace) -> int:
    from otel_ttft.replay.demo import run_demo

    return run_demo(args.out, keep_going=args.keep_going)


def _report(args: argparse.Namespace) -> int:
    from otel_ttft.analysis.contract import AnalysisFileError, load_analysis
    from otel_ttft.analysis.report import ReportError, write_report

    try:
        path = write_report(load_analysis(args.analysis), args.output)
    except (AnalysisFileError, ReportError) as exc:
        print(f"otel-ttft report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from otel_ttft.analysis.check import ThresholdError, build_thresholds, run_check
    from otel_ttft.analysis.contract import AnalysisFileError, load_analysis

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
    from otel_ttft.replay.command import main

    return main(args)


def _prometheus(args: argparse.Namespace) -> int:
    from otel_ttft.prom import serve

    return serve.main(args)


def _doctor(argv: Sequence[str]) -> int:
    from otel_ttft import doctor

    return int(doctor.main(list(argv)) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-ttft", description="Split vLLM time-to-first-token into named stages.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="start a tiny vLLM under instrumentation and show its trace")
    p.add_argument("--out", default="out/demo", help="where telemetry is stored (out/demo)")
    p.add_argument("--keep-going", action="store_true",
                   help="a failed request does not end or fail the demo")
    p.set_defaults(func=_demo)

    p = sub.add_parser("sink", help="run the embedded OTLP receiver into a local store")
    p.add_argument("--dir", required=True, help="store directory (telemetry.db)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=_port(0), default=4318, help="0 picks a free port")
    p.add_argument("--grpc-port", type=_port(-1), default=4317, help="-1 disables gRPC")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="accept unauthenticated writes from other hosts")
    p.set_defaults(func=_sink)

    p = sub.add_parser("tree", help="render span trees from a store dir, spans.jsonl or OTLP JSON")
    p.add_argument("path")
    p.add_argument("--trace", help="only this trace id (32 hex)")
    p.add_argument("--max-depth", type=_non_negative, default=None)
    p.set_defaults(func=_tree)

    p = sub.add_parser("analyze", help="split each first token into stages and name the stage "
                                       "to fix")
    p.add_argument("source", help="store directory, spans .jsonl / OTLP JSON file, or a Tempo "
                                  "base URL (http://tempo:3200)")
    p.add_argument("--json", metavar="FILE", help="also write the analysis (otel-ttft/analysis/v1)")
    p.add_argument("--baseline", help="scenario to compare against (default: short-prompt, or "
                                      "MODEL:warm for live traffic)")
    p.add_argument("--run", help="only this replay run id (needed when runs differ)")
    p.add_argument("--since", type=_positive(float), default=None,
                   help="Tempo: search the last N seconds (default 86400)")
    p.add_argument("--limit", type=_positive(int), default=None,
                   help="Tempo: at most N traces (default 5000)")
    p.set_defaults(func=_analyze)

    p = sub.add_parser("report", help="write a self-contained HTML report from an analysis.json")
    p.add_argument("analysis", metavar="ANALYSIS_JSON")
    p.add_argument("-o", "--output", default="report.html", help="HTML file (report.html)")
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

    p = sub.add_parser("export", help="write a store's spans as OTLP/JSON (file exporter format)")
    p.add_argument("path", help="store dir, telemetry.db, spans.jsonl or OTLP/JSON")
    p.add_argument("-o", "--output", required=True, help="file to write ('-' for stdout)")
    p.set_defaults(func=_export)

    p = sub.add_parser("replay", help="replay the switch scenarios against real servers, traced")
    from otel_ttft.replay.command import add_arguments as add_replay_arguments

    add_replay_arguments(p)
    p.set_defaults(func=_replay)

    p = sub.add_parser("prometheus", help="serve a store's metrics for Prometheus to scrape (the "
                       "Collector's names), or write them as OpenMetrics for backfilling")
    p.add_argument("--dir", required=True, help="store directory written by `otel-ttft sink`")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9464, help="0 picks a free port (9464)")
    p.add_argument("--expire", type=float, default=1800,
                   help="drop series not updated for this many seconds (1800; 0 keeps all)")
    p.add_argument("--openmetrics", metavar="FILE",
                   help="write every point with its timestamp to FILE ('-' for stdout) and exit")
    p.add_argument("--shift", type=float, default=0.0,
                   help="with --openmetrics: add this many seconds to every timestamp")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="listen on a non-loopback address")
    p.set_defaults(func=_prometheus)

    sub.add_parser("doctor", add_help=False, help="which hooks are live for the installed vLLM")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "doctor":  # its options are its own
        return _doctor(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `otel-ttft ... | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
