"""Spans per second the sink accepts over OTLP/HTTP and OTLP/gRPC from many concurrent
exporters, and a check that every acknowledged span is in the store.

The sink runs as ``otel-ttft sink`` in its own process; the exporters are threads spread over
client processes, each with its own keep-alive connection (HTTP) or channel (gRPC), posting
pre-encoded protobuf batches of 512 spans (the SDK's BatchSpanProcessor default) and retrying
a 503/UNAVAILABLE after a pause, as the SDK exporters do. Client encoding is done before the
clock starts: what is timed is the sink.

    .venv/bin/python benchmarks/sink_throughput.py [--exporters 200] [--batches 2]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from otel_ttft import semconv

SPANS_PER_BATCH = 512
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def encode_batch(exporter: int, batch: int, n: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (("service.name", "vllm"), ("vllm.process_kind", "worker"),
                       ("host.name", "bench"), ("telemetry.sdk.language", "python")):
        rs.resource.attributes.add(key=key).value.string_value = value
    rs.resource.attributes.add(key="process.pid").value.int_value = 1000 + exporter
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_ttft"
    base = (exporter << 40) | (batch << 20)
    t0 = 1_800_000_000_000_000_000 + base
    for i in range(n):
        sid = base | (i + 1)
        span = ss.spans.add(trace_id=(sid // 8 + 1).to_bytes(16, "big"),
                            span_id=sid.to_bytes(8, "big"), name=semconv.SPAN_REQUEST_QUEUE, kind=1,
                            start_time_unix_nano=t0 + i * 1000,
                            end_time_unix_nano=t0 + i * 1000 + 500)
        if i % 8:
            span.parent_span_id = ((sid & ~7) | 1).to_bytes(8, "big")
        span.attributes.add(key=semconv.ATTR_STAGE).value.string_value = semconv.STAGE_QUEUE
        span.attributes.add(key=semconv.ATTR_PROCESS_KIND).value.string_value = "engine_core"
        span.attributes.add(key=semconv.ATTR_REQUEST_PREEMPTIONS).value.int_value = i % 3
        span.attributes.add(key=semconv.ATTR_REQUEST_ARRIVAL_KV_USAGE).value.double_value = 0.25
    return req.SerializeToString()


def _exporter(protocol: str, endpoint: str, bodies: list[bytes], out: list[int]) -> None:
    acked = retries = 0
    if protocol == "http":
        host, port = endpoint.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        for body in bodies:
            while True:
                try:
                    conn.request("POST", "/v1/traces", body,
                                 {"Content-Type": "application/x-protobuf"})
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()
                    status = 0
                if status == 200:
                    acked += SPANS_PER_BATCH
                    break
                retries += 1
                time.sleep(0.5)
        conn.close()
    else:
        import grpc

        # its own connection, as an exporter in its own process has
        with grpc.insecure_channel(endpoint.removeprefix("http://"),
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            export = channel.unary_unary(EXPORT_METHOD)  # bytes in, bytes out: no re-encoding
            for body in bodies:
                while True:
                    try:
                        export(body, timeout=120)
                        acked += SPANS_PER_BATCH
                        break
                    except grpc.RpcError as exc:
                        retries += 1
                        if retries == 1:
                            print(f"gRPC retry: {exc.code()} {exc.details()}", file=sys.stderr)
                        time.sleep(0.5)
    out.extend((acked, retries))


def client_process(protocol: str, endpoint: str, exporters: range, batches: int,
                   barrier: mp.Barrier, results: mp.Queue) -> None:
    bodies = {e: [encode_batch(e, b, SPANS_PER_BATCH) for b in range(batches)] for e in exporters}
    outs: list[list[int]] = [[] for _ in exporters]
    threads = [threading.Thread(target=_exporter, args=(protocol, endpoint, bodies[e], out))
               for e, out in zip(exporters, outs, strict=True)]
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((started, time.perf_counter(), sum(o[0] for o in outs),
                 sum(o[1] for o in outs)))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(protocol: str, endpoint: str, sink_pid: int, exporters: int, batches: int,
        processes: int, offset: int) -> tuple[float, int, int, float]:
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(processes + 1), ctx.Queue()
    ids = range(offset, offset + exporters)
    procs = [ctx.Process(target=client_process, args=(protocol, endpoint, ids[i::processes],
                                                      batches, barrier, results))
             for i in range(processes)]
    for p in procs:
        p.start()
    barrier.wait()  # every client has encoded its batches
    cpu0 = cpu_seconds(sink_pid)
    got = [results.get() for _ in procs]
    cpu = cpu_seconds(sink_pid) - cpu0
    for p in procs:
        p.join()
    wall = max(g[1] for g in got) - min(g[0] for g in got)
    return wall, sum(g[2] for g in got), sum(g[3] for g in got), cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exporters", type=int, default=200)
    parser.add_argument("--batches", type=int, default=2, help="per exporter and protocol")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--protocol", choices=("http", "grpc", "both"), default="both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otel-ttft-sink-bench-") as tmp:
        store = Path(tmp) / "store"
        sink = subprocess.Popen(
            [sys.executable, "-m", "otel_ttft.tools.cli", "sink", "--dir", str(store),
             "--http-port", "0", "--grpc-port", "0"], stdout=subprocess.PIPE, text=True)
        endpoints = {}
        for _ in range(2):
            kind, url, *_ = sink.stdout.readline().split()
            endpoints["http" if kind == "OTLP/HTTP" else "grpc"] = url
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"{args.exporters} exporters x {args.batches} batches x {SPANS_PER_BATCH} spans "
              f"per protocol, {args.client_processes} client processes")
        acked_total, offset = 0, 0
        try:
            for protocol in (("http", "grpc") if args.protocol == "both" else (args.protocol,)):
                wall, acked, retries, cpu = run(protocol, endpoints[protocol], sink.pid,
                                                args.exporters, args.batches,
                                                args.client_processes, offset)
                offset += args.exporters
                acked_total += acked
                with sqlite3.connect(store / "telemetry.db") as conn:
                    stored = conn.execute("SELECT count(DISTINCT span_id) FROM spans").fetchone()
                print(f"{protocol:<5} {acked / wall:9,.0f} spans/s accepted  ({acked:,} spans in "
                      f"{wall:.1f} s; sink CPU {cpu:.1f} s = {acked / max(cpu, 1e-9):,.0f} "
                      f"spans per CPU-second; {retries} retries)  stored {stored[0]:,} of "
                      f"{acked_total:,} acknowledged")
                if stored[0] < acked_total:
                    print("LOST ACKNOWLEDGED SPANS", file=sys.stderr)
                    return 1
        finally:
            sink.terminate()
            sink.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
