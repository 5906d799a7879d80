"""`tree` and `analyze` over a store of 1,000,000 spans: 100,000 request
trees and 20 activations, written straight through the store API in batches.

Each command runs in its own process, timed wall-clock, with its peak RSS from the kernel
(``ru_maxrss`` of the waited-for child), so "bounded memory" is a number, not a claim.

    .venv/bin/python benchmarks/store_million.py [--store DIR] [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otel_ttft import semconv
from otel_ttft.tools.sink.store import SpanStore

T0 = 1_800_000_000_000_000_000
MS = 1_000_000
REQUEST_STAGES = (
    (semconv.SPAN_REQUEST_INPUT, semconv.STAGE_FRONTEND),
    (semconv.SPAN_REQUEST_QUEUE, semconv.STAGE_QUEUE),
    (semconv.SPAN_REQUEST_PREFILL, semconv.STAGE_PREFILL),
    (semconv.SPAN_REQUEST_OUTPUT, semconv.STAGE_FRONTEND),
    (semconv.SPAN_REQUEST_FIRST_DECODE, semconv.STAGE_FIRST_DECODE),
)
RESOURCES = [{"service.name": "vllm", "vllm.process_kind": kind, "process.pid": pid,
              "host.name": "bench", "telemetry.sdk.language": "python"}
             for pid, kind in enumerate(("api_server", "engine_core", "worker"), 1000)]


def _span(trace: int, sid: int, parent: int | None, name: str, start: int, end: int,
          resource: dict, **attributes: object) -> dict:
    return {"trace_id": f"{trace:032x}", "span_id": f"{sid:016x}",
            "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
            "kind": "INTERNAL", "start_ns": start, "end_ns": end, "attributes": attributes,
            "resource": resource, "scope": "otel_ttft", "events": [], "links": [],
            "status": {"code": "UNSET", "message": ""}}


def request_tree(trace: int, rng: random.Random) -> list[dict]:
    """An llm_request with its five stage children and three nested detail spans: 9 spans."""
    base, sid = T0 + trace * 50 * MS, trace << 8
    spans = [_span(trace, sid, None, semconv.SPAN_REQUEST, base, base + 400 * MS, RESOURCES[0],
                   **{semconv.ATTR_REQUEST_TTFT: 0.2, semconv.ATTR_REQUEST_STREAMING: True,
                      semconv.ATTR_PROCESS_KIND: "api_server"})]
    cursor = base
    for i, (name, stage) in enumerate(REQUEST_STAGES, 1):
        length = rng.randint(5, 60) * MS
        spans.append(_span(trace, sid + i, sid, name, cursor, cursor + length, RESOURCES[1],
                           **{semconv.ATTR_STAGE: stage}))
        if i <= 3:
            spans.append(_span(trace, sid + 10 + i, sid + i, f"{name} detail", cursor,
                               cursor + length // 2, RESOURCES[2]))
        cursor += length
    return spans


def activation_tree(index: int, size: int) -> list[dict]:
    """An activation with load (many shard reads) and warm-up stages: ``size`` spans."""
    trace = (1 << 120) + index
    base, sid = T0 + index * 60_000 * MS, (1 << 60) + (index << 20)
    root = _span(trace, sid, None, semconv.SPAN_ACTIVATION, base, base + 50_000 * MS,
                 RESOURCES[0], **{semconv.ATTR_PROCESS_KIND: "api_server"})
    load = _span(trace, sid + 1, sid, "Load model", base + 1000 * MS, base + 30_000 * MS,
                 RESOURCES[2], **{semconv.ATTR_STAGE: semconv.STAGE_LOAD})
    warm = _span(trace, sid + 2, sid, semconv.SPAN_TORCH_COMPILE, base + 30_000 * MS,
                 base + 45_000 * MS, RESOURCES[2],
                 **{semconv.ATTR_STAGE: semconv.STAGE_WARMUP_COMPILE})
    spans = [root, load, warm]
    step = 29_000 * MS // size
    for i in range(size - 3):
        start = base + 1000 * MS + i * step
        spans.append(_span(trace, sid + 3 + i, sid + 1, semconv.SPAN_SHARD_READ, start,
                           start + step, RESOURCES[2],
                           **{semconv.ATTR_STAGE: semconv.STAGE_LOAD_READ,
                              semconv.ATTR_SHARD_BYTES: 4_000_000_000 // size,
                              semconv.ATTR_READ_GB_PER_S: 1.7}))
    return spans


def build(store_dir: Path, requests: int, activations: int, total: int) -> float:
    rng = random.Random(8)
    store = SpanStore(store_dir)
    started = time.perf_counter()
    cpu = time.process_time()
    batch: list[dict] = []
    for trace in range(1, requests + 1):
        batch.extend(request_tree(trace, rng))
        if len(batch) >= 5000:
            store.add_spans(batch)
            batch = []
    per_activation = (total - requests * 9) // activations
    for index in range(activations):
        batch.extend(activation_tree(index, per_activation))
        store.add_spans(batch)
        batch = []
    store.add_spans(batch)
    store.close()
    return time.perf_counter() - started, time.process_time() - cpu


ITER_TRACES = """
import sys
from otel_ttft.tools.analysis.traces import iter_traces
traces = spans = 0
for trace in iter_traces(sys.argv[1]):
    traces += 1
    spans += len(trace)
print(f"{traces} traces, {spans} spans")
"""


def timed(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall s, peak RSS MiB, last line of stdout) of one child process (its own rusage, from
    wait4); stdout goes to a temporary file, as a redirect to disk would."""
    with tempfile.TemporaryFile("w+") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[2:]} failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        out.seek(0, os.SEEK_END)
        size = out.tell()
        out.seek(max(0, size - 4096))
        lines = out.read().strip().splitlines()
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, f"{size / 2**20:.0f} MiB of output; " + (
        lines[-1] if lines else "")[:80]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, help="reuse or create the store here")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--activations", type=int, default=20)
    parser.add_argument("--spans", type=int, default=1_000_000)
    args = parser.parse_args()
    tmp = None
    if args.store is None:
        tmp = tempfile.TemporaryDirectory(prefix="otel-ttft-1m-")
        args.store = Path(tmp.name) / "store"
    if not (args.store / "telemetry.db").exists():
        seconds, cpu = build(args.store, args.requests, args.activations, args.spans)
        print(f"built {args.spans:,} spans ({args.requests:,} request trees, "
              f"{args.activations} activations) through SpanStore.add_spans in {seconds:.1f} s "
              f"wall, {cpu:.1f} s CPU ({args.spans / seconds:,.0f} spans/s)")
    size = sum(f.stat().st_size for f in args.store.iterdir()) / 2**20
    print(f"store: {size:.0f} MiB on disk; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    py = sys.executable
    runs = {
        "iter_traces (all traces)": [py, "-c", ITER_TRACES, str(args.store)],
        "otel-ttft tree": [py, "-m", "otel_ttft.tools.cli", "tree", str(args.store)],
    }
    probe = subprocess.run([py, "-m", "otel_ttft.tools.cli", "analyze", "--help"],
                           capture_output=True)
    if probe.returncode == 0:
        runs["otel-ttft analyze"] = [py, "-m", "otel_ttft.tools.cli", "analyze", str(args.store)]
        # with the document written: every request's segments too, and a 100+ MB file
        json_out = Path(tempfile.mkdtemp(prefix="otel-ttft-1m-json-")) / "analysis.json"
        runs["otel-ttft analyze --json"] = [py, "-m", "otel_ttft.tools.cli", "analyze",
                                            str(args.store), "--json", str(json_out)]
    for label, argv in runs.items():
        load = os.getloadavg()[0]
        wall, cpu, rss, tail = timed(argv)
        print(f"{label:<26} load {load:4.1f}  {wall:6.1f} s wall  {cpu:6.1f} s CPU  "
              f"peak RSS {rss:5.0f} MiB  ({tail})")
    if probe.returncode == 0:
        json_out.unlink(missing_ok=True)
        json_out.parent.rmdir()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
