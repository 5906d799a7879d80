"""End-to-end cost of the request path, as a user would see it: the same fixed workload against
the same tiny model, served twice at once -- plain vLLM (our plugin switched off) and instrumented
(``opentelemetry-instrument``, spans and metrics exported over OTLP/HTTP to a live receiver in this
process) -- in rounds whose arm order alternates (A/B, B/A, ...). The server not being measured is
paused (SIGSTOP to its process group): an idle vLLM still polls its queues and would take CPU from
the other.

The figure that matters is **CPU-seconds per request** of each server process (API server,
EngineCore, worker), read from ``/proc/<pid>/stat`` (utime + stime, all threads) around each run
plus a short settle window. The exporters keep the SDK's defaults (a span batch every 5 s or 512
spans, metrics every 60 s): a batch still queued when a run ends goes out at the start of that
arm's next run, so over the rounds every span's encoding and sending is counted. The API server's
CPU is also split by thread (its main thread: vLLM's event loop and our hooks; the SDK's export
threads). CPU time is what contention on a shared machine hurts least. Reported per round, per
pair (instrumented minus plain) and as the median ratio; throughput and client TTFT ratios
are printed next to them.

``--profile DIR`` adds one unmeasured instrumented run under ``py-spy record`` (raw collapsed
stacks of the API server and EngineCore), summarised by the share of samples in our code, in the
OpenTelemetry SDK/exporter and in vLLM.

``--rate R`` paces the client (open loop, R requests/s) so that both arms take the same wall time
(vLLM's API process does work per second as well as per request: with a closed loop, the slower
arm pays more of it per request): plain vLLM alone swings by +-15 % from round to round
closed-loop on this 2-core machine.

Usage: python benchmarks/request_overhead.py [--rounds 6] [--requests 300] [--concurrency 4]
       [--max-tokens 16] [--rate R] [--profile DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from otel_ttft.tools.replay.server import VllmServer
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model

EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_SERVICE_NAME": "vllm-bench",
}  # the SDK's batching defaults: what a user gets


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
        concurrency: int, rate: float | None = None) -> dict:
    """All prompts, streamed: ``concurrency`` at a time (closed loop), or, with ``rate``, one
    started every ``1/rate`` s whatever the server does (open loop: both arms then take the same
    wall time, so per-second work in the server weighs the same on both)."""
    t0 = time.monotonic()
    if rate is None:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda p: one(server.port, model, p, max_tokens), prompts))
    else:
        def paced(item: tuple[int, list[int]]) -> tuple[float, int]:
            delay = t0 + item[0] / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            return one(server.port, model, item[1], max_tokens)

        with ThreadPoolExecutor(max(concurrency, int(rate * 4) + 4)) as pool:
            results = list(pool.map(paced, enumerate(prompts)))
    wall = time.monotonic() - t0
    return {"wall_s": wall, "tokens": sum(c for _, c in results),
            "tokens_per_s": sum(c for _, c in results) / wall,
            "ttft_s": [t for t, _ in results]}


def pause(server: VllmServer, paused: bool) -> None:
    os.killpg(os.getpgid(server.pid), signal.SIGSTOP if paused else signal.SIGCONT)
    if not paused:
        time.sleep(0.5)  # let its threads (span export, stats) catch up before measuring


_TICK = os.sysconf("SC_CLK_TCK")


def processes(server: VllmServer) -> dict[str, list[int]]:
    """The server's processes by role: ``api`` (the leader), ``engine`` (EngineCore),
    ``worker``, ``other`` (e.g. multiprocessing's resource tracker)."""
    pgid = os.getpgid(server.pid)
    roles: dict[str, list[int]] = {"api": [], "engine": [], "worker": [], "other": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) != pgid:  # field 5: process group
            continue
        pid = int(entry)
        role = ("api" if pid == server.pid else "engine" if "Engine" in comm
                else "worker" if "Worker" in comm else "other")
        roles[role].append(pid)
    return roles


def _cpu_ticks(stat_path: str) -> int | None:
    """utime + stime (fields 14 and 15) from a /proc stat file; None when it is gone."""
    try:
        stat = Path(stat_path).read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), in seconds."""
    return sum(_cpu_ticks(f"/proc/{pid}/stat") or 0 for pid in pids) / _TICK


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU-seconds per thread id of one process."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    ticks = {int(tid): _cpu_ticks(f"/proc/{pid}/task/{tid}/stat") for tid in tids}
    return {tid: n / _TICK for tid, n in ticks.items() if n is not None}


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (``py-spy dump``), when py-spy is installed."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        text = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {pid: "MainThread"}
    names = {int(m[1]): m[2] for m in re.finditer(r'Thread (?:0x[0-9A-Fa-f]+ )?\(?(\d+)\)?'
                                                 r'[^"\n]*"([^"]+)"', text)}
    names.setdefault(pid, "MainThread")
    return names


def measured_run(server: VllmServer, roles: dict[str, list[int]], model: str,
                 prompts: list[list[int]], max_tokens: int, concurrency: int,
                 settle_s: float, rate: float | None = None) -> dict:
    """One run with each process's CPU-seconds, counted to ``settle_s`` after the last reply."""
    before = {role: cpu_seconds(pids) for role, pids in roles.items()}
    api_before = thread_cpu(server.pid)
    res = run(server, model, prompts, max_tokens, concurrency, rate)
    time.sleep(settle_s)
    res["cpu_s"] = {role: cpu_seconds(pids) - before[role] for role, pids in roles.items()}
    res["api_threads_s"] = {tid: t - api_before.get(tid, 0.0)
                            for tid, t in thread_cpu(server.pid).items()}
    return res


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def profile(server: VllmServer, roles: dict[str, list[int]], model: str,
            prompts: list[list[int]], args: argparse.Namespace, out: Path) -> dict:
    """One unmeasured run under ``py-spy record`` (API server and EngineCore), summarised."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    recorders = []
    for role in ("api", "engine"):
        for pid in roles[role]:
            recorders.append((role, out / f"{role}-{pid}.txt", subprocess.Popen(
                [py_spy, "record", "--nonblocking", "--threads", "--rate", "200", "--format",
                 "raw", "--output", str(out / f"{role}-{pid}.txt"), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    time.sleep(1.0)  # py-spy attaches
    try:
        run(server, model, prompts, args.max_tokens, args.concurrency)
        time.sleep(args.settle_s)
    finally:
        for _, _, proc in recorders:
            proc.send_signal(signal.SIGINT)
        for _, _, proc in recorders:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {f"{role}:{path.name}": summarise(path) for role, path, _ in recorders
            if path.exists()}


_BUCKETS = (  # first match, innermost frame first: who is on CPU
    ("otel_ttft", "/otel_ttft/"),
    ("otel_exporter", "opentelemetry/exporter/"),
    ("otel_proto_encode", "google/protobuf/"),
    ("otel_sdk", "opentelemetry/sdk/"),
    ("otel_api", "opentelemetry/"),
    ("wrapt", "/wrapt/"),
)


def summarise(path: Path, top: int = 25) -> dict:
    """Share of on-CPU samples by owner: innermost frame's package, our code counted wherever it
    sits on the stack (what we call runs on our behalf), plus the top leaf functions."""
    owners: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if frames and "idle" in frames[-1].lower():
            continue
        total += n
        threads[frames[0][:60]] += n
        leaf = frames[-1]
        leaves[leaf[:120]] += n
        owner = next((name for name, key in _BUCKETS if key in leaf), None)
        if owner is None:
            owner = next((name for name, key in _BUCKETS[:4] if any(key in f for f in frames)),
                         "vllm_and_rest")
        owners[owner] += n
        entry = next((f for f in frames if "/otel_ttft/" in f), None)
        if entry is not None:
            ours[entry[:120]] += n
    share = {k: round(100 * v / total, 2) for k, v in owners.most_common()} if total else {}
    return {"samples": total, "owner_pct": share,
            "threads_pct": {k: round(100 * v / total, 2) for k, v in threads.most_common(8)},
            "our_entry_points_pct": {k: round(100 * v / total, 2)
                                     for k, v in ours.most_common(top)},
            "top_leaves_pct": {k: round(100 * v / total, 2) for k, v in leaves.most_common(top)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6, help="rounds; arm order alternates")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=None,
                    help="open loop: start this many requests per second (default: closed loop)")
    ap.add_argument("--settle-s", type=float, default=1.5,
                    help="CPU counted this long after each run (the exporter's last batch)")
    ap.add_argument("--profile", help="directory: one extra instrumented run under py-spy")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for the instrumented server (repeatable)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    model_dir = ensure_tiny_model()
    model = str(model_dir)
    prompts = workload(args.requests)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-bench-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    plain = VllmServer(model_dir, instrument=False, env={"VLLM_PLUGINS": "none"},
                       log_path=work / "plain.log")
    extra = dict(item.split("=", 1) for item in args.env)
    traced = VllmServer(model_dir, instrument=True,
                        env={**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
                             **extra},
                        log_path=work / "traced.log")
    results: dict[str, list[dict]] = {"plain": [], "instrumented": []}
    profiles = {}
    load = [os.getloadavg()[0]]
    try:
        plain.start()
        traced.start()
        roles = {"plain": processes(plain), "instrumented": processes(traced)}
        for server in (plain, traced):  # warm-up run each, discarded
            run(server, model, prompts[: args.concurrency * 4], args.max_tokens, args.concurrency)
        names = {"plain": thread_names(plain.pid), "instrumented": thread_names(traced.pid)}
        pause(plain, True)
        pause(traced, True)
        for r in range(args.rounds):
            order = [("plain", plain), ("instrumented", traced)]
            for name, server in (order if r % 2 == 0 else order[::-1]):
                pause(server, False)
                try:
                    res = measured_run(server, roles[name], model, prompts, args.max_tokens,
                                       args.concurrency, args.settle_s, args.rate)
                finally:
                    pause(server, True)
                results[name].append(res)
                load.append(os.getloadavg()[0])
                cpu = {k: v / args.requests * 1e3 for k, v in res["cpu_s"].items()}
                print(f"round {r} {name:12s} API {cpu['api']:6.2f} ms/req  EngineCore "
                      f"{cpu['engine']:6.2f}  worker {cpu['worker']:6.2f}  "
                      f"{args.requests / res['wall_s']:6.1f} req/s  load {load[-1]:.2f}",
                      flush=True)
        if args.profile:
            pause(traced, False)
            profiles = profile(traced, roles["instrumented"], model, prompts, args,
                               Path(args.profile))
            pause(traced, True)
    finally:
        for server in (traced, plain):
            if server.pid is not None:
                pause(server, False)
            server.stop()
        receiver.stop()

    n = args.requests

    def per_req(name: str, role: str) -> list[float]:
        return [r["cpu_s"][role] / n * 1e3 for r in results[name]]

    def rps(name: str) -> list[float]:
        return [n / r["wall_s"] for r in results[name]]

    def ttfts(name: str) -> list[float]:
        return [t for r in results[name] for t in r["ttft_s"]]

    def ratio(role: str) -> dict:
        a, b = per_req("instrumented", role), per_req("plain", role)
        pairs = [x / y for x, y in zip(a, b, strict=True) if y]
        return {"plain_ms_per_request": [round(v, 3) for v in b],
                "instrumented_ms_per_request": [round(v, 3) for v in a],
                "pair_difference_ms": [round(x - y, 3) for x, y in zip(a, b, strict=True)],
                "median_pair_ratio": round(statistics.median(pairs), 4) if pairs else None,
                "ratio_of_medians": round(statistics.median(a) / statistics.median(b), 4)
                if statistics.median(b) else None}

    def by_thread(name: str) -> dict[str, float]:
        """Median ms per request of each named API-server thread (the rest summed as other)."""
        per_round: list[Counter[str]] = []
        for r in results[name]:
            c: Counter[str] = Counter()
            for tid, sec in r["api_threads_s"].items():
                c[names[name].get(tid, "other threads")] += sec / n * 1e3
            per_round.append(c)
        keys = {k for c in per_round for k in c}
        return {k: round(statistics.median(c[k] for c in per_round), 3) for k in sorted(keys)}

    request_spans = sum(1 for s in receiver.store.spans() if s["name"] == "llm_request")
    figures = {
        "rounds": args.rounds, "requests_per_run": n, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "instrumented_env": extra,
        "rate_req_s": args.rate,
        "load_average_1m": {"min": min(load), "max": max(load)},
        "cpu_api": ratio("api"), "cpu_engine_core": ratio("engine"),
        "cpu_worker": ratio("worker"),
        "api_threads_ms_per_request": {k: by_thread(k) for k in results},
        "throughput_req_s": {k: round(statistics.median(rps(k)), 2) for k in results},
        "throughput_ratio": round(statistics.median(rps("instrumented")) /
                                  statistics.median(rps("plain")), 4),
        "ttft_p50_ratio": round(pct(ttfts("instrumented"), 0.5) / pct(ttfts("plain"), 0.5), 4),
        "ttft_p99_ratio": round(pct(ttfts("instrumented"), 0.99) / pct(ttfts("plain"), 0.99), 4),
        "request_spans_received": request_spans,
        "spans_received": sum(1 for _ in receiver.store.spans()),
    }
    if profiles:
        figures["profile"] = profiles
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
