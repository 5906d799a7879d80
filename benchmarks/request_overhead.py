"""End-to-end overhead of the request path: the same fixed workload against the same tiny model,
served twice at once -- plain vLLM (our plugin switched off) and instrumented
(``opentelemetry-instrument``, spans and metrics exported to a live OTLP receiver in this
process) -- in alternating A/B/B/A runs. The server not being measured is paused (SIGSTOP to its
process group): an idle vLLM worker still polls its queue and would take CPU from the other.

Reports the throughput ratio (instrumented / plain, medians of the runs, with a bootstrap 95%
interval) and the p50/p99 TTFT ratios (client-observed, all requests of all runs pooled). Not a
test: on a shared 2-core machine, read the ratios next to the spread printed with them. Seen here
with both servers alike: in some runs every first chunk reaches the client ~50 ms after vLLM's
StreamingResponse handed it to the ASGI send (after the end of the server-side TTFT we report),
which makes client p50 TTFT bimodal per run.

Usage: python benchmarks/request_overhead.py [--rounds 8] [--requests 128] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from otel_ttft.replay.server import VllmServer
from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import SpanStore
from otel_ttft.tiny_model import ensure_tiny_model

EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_SERVICE_NAME": "vllm-bench",
}


def workload(n: int, seed: int = 0) -> list[list[int]]:
    """Fixed prompts (token ids): short, medium and long, none sharing a prefix."""
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range((16, 64, 256)[i % 3])] for i in range(n)]


def one(port: int, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """Client TTFT (s) and output tokens of one streamed completion, over a raw socket: the
    first ``data:`` counts when its bytes arrive, with no client-side buffering in between."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=300)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    ttft, data = None, bytearray()
    try:
        sock.sendall(head + body)
        while chunk := sock.recv(65536):
            data += chunk
            if ttft is None and b"data: {" in data:
                ttft = time.monotonic() - t0
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 200"), bytes(data[:300])
    chunks = data.count(b"data: {")
    return ttft or float("nan"), chunks


def run(server: VllmServer, model: str, prompts: list[list[int]], max_tokens: int,
        concurrency: int) -> dict:
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one(server.port, model, p, max_tokens), prompts))
    wall = time.monotonic() - t0
    return {"wall_s": wall, "tokens": sum(c for _, c in results),
            "tokens_per_s": sum(c for _, c in results) / wall,
            "ttft_s": [t for t, _ in results]}


def pause(server: VllmServer, paused: bool) -> None:
    os.killpg(os.getpgid(server.pid), signal.SIGSTOP if paused else signal.SIGCONT)
    if not paused:
        time.sleep(0.5)  # let its threads (span export, stats) catch up before measuring


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8, help="runs per server (A/B/B/A order)")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    model_dir = ensure_tiny_model()
    model = str(model_dir)
    prompts = workload(args.requests)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-bench-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    plain = VllmServer(model_dir, instrument=False, env={"VLLM_PLUGINS": "none"},
                       log_path=work / "plain.log")
    traced = VllmServer(model_dir, instrument=True,
                        env={**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint},
                        log_path=work / "traced.log")
    results: dict[str, list[dict]] = {"plain": [], "instrumented": []}
    try:
        plain.start()
        traced.start()
        for server in (plain, traced):  # warm-up run each, discarded
            run(server, model, prompts[: args.concurrency * 2], args.max_tokens, args.concurrency)
        pause(plain, True)
        pause(traced, True)
        for r in range(args.rounds):
            order = [("plain", plain), ("instrumented", traced)]
            for name, server in (order if r % 2 == 0 else order[::-1]):
                pause(server, False)
                try:
                    res = run(server, model, prompts, args.max_tokens, args.concurrency)
                finally:
                    pause(server, True)
                results[name].append(res)
                print(f"round {r} {name:12s} {res['tokens_per_s']:8.1f} tok/s "
                      f"p50 TTFT {statistics.median(res['ttft_s']) * 1e3:6.1f} ms", flush=True)
    finally:
        for server in (traced, plain):
            if server.pid is not None:
                pause(server, False)
            server.stop()
        receiver.stop()

    def tput(name: str) -> list[float]:
        return [r["tokens_per_s"] for r in results[name]]

    def ttfts(name: str) -> list[float]:
        return [t for r in results[name] for t in r["ttft_s"]]

    request_spans = sum(1 for s in receiver.store.spans() if s["name"] == "llm_request")
    rng = random.Random(1)

    def boot_ratio() -> list[float]:
        """95% bootstrap interval of the throughput ratio (medians of resampled runs)."""
        a, b = tput("instrumented"), tput("plain")
        ratios = sorted(statistics.median(rng.choices(a, k=len(a))) /
                        statistics.median(rng.choices(b, k=len(b))) for _ in range(2000))
        return [ratios[50], ratios[1949]]

    figures = {
        "rounds": args.rounds, "requests_per_run": args.requests,
        "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "throughput_tok_s": {k: statistics.median(tput(k)) for k in results},
        "throughput_spread_pct": {k: 100 * (max(tput(k)) - min(tput(k))) / statistics.median(
            tput(k)) for k in results},
        "throughput_ratio": statistics.median(tput("instrumented")) /
        statistics.median(tput("plain")),
        "throughput_ratio_95ci": boot_ratio(),
        "ttft_p50_ms": {k: pct(ttfts(k), 0.5) * 1e3 for k in results},
        "ttft_p99_ms": {k: pct(ttfts(k), 0.99) * 1e3 for k in results},
        "ttft_p50_ratio": pct(ttfts("instrumented"), 0.5) / pct(ttfts("plain"), 0.5),
        "ttft_p99_ratio": pct(ttfts("instrumented"), 0.99) / pct(ttfts("plain"), 0.99),
        "request_spans_received": request_spans,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
