"""``otel-ttft``: a thin dispatcher; each subcommand's logic lives in its own module."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path


def _sink(args: argparse.Namespace) -> int:
    from otel_ttft.sink.receiver import OTLPReceiver
    from otel_ttft.sink.store import SpanStore

    grpc_port = None if args.grpc_port < 0 else args.grpc_port
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


def _tree(args: argparse.Namespace) -> int:
    from otel_ttft.analysis.traces import (
        TraceFileError,
        build_trees,
        find_activation_roots,
        find_request_spans,
        load_spans,
    )
    from otel_ttft.analysis.tree import render_tree

    try:
        spans = load_spans(args.path)
    except TraceFileError as exc:
        print(f"otel-ttft tree: {exc}", file=sys.stderr)
        return 2
    if args.trace:
        spans = [s for s in spans if s["trace_id"] == args.trace.lower()]
        if not spans:
            print(f"otel-ttft tree: no spans of trace {args.trace} in {args.path}",
                  file=sys.stderr)
            return 2
    roots = find_activation_roots(spans) + find_request_spans(spans) or sorted(
        (r for rs in build_trees(spans).values() for r in rs), key=lambda r: r.start_ns)
    if not roots:
        print(f"otel-ttft tree: no spans in {args.path}", file=sys.stderr)
        return 2
    print("\n\n".join(render_tree(root, max_depth=args.max_depth) for root in roots))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from otel_ttft.replay.demo import run_demo

    return run_demo(args.out, keep_going=args.keep_going)


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
    p.add_argument("--dir", required=True, help="store directory (spans.jsonl, metrics.jsonl)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=4318)
    p.add_argument("--grpc-port", type=int, default=4317, help="-1 disables gRPC")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="accept unauthenticated writes from other hosts")
    p.set_defaults(func=_sink)

    p = sub.add_parser("tree", help="render span trees from a store dir, spans.jsonl or OTLP JSON")
    p.add_argument("path")
    p.add_argument("--trace", help="only this trace id (32 hex)")
    p.add_argument("--max-depth", type=int, default=None)
    p.set_defaults(func=_tree)

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
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
