"""Start-up, request latency and exit, side by side in one script: plain vLLM, and instrumented vLLM
with a live collector, a dead one (nothing listening), a slow one (accepts, never answers) and a
flapping one (up 5 s, down 5 s). Arms alternate so drift hits all of them alike.

    .venv/bin/python benchmarks/startup.py [--rounds 2] [--eager] [--requests 20]
                                           [--soak-s 600 --soak-arm slow]

Per arm (median over rounds): time from exec to a healthy ``/health``, median request latency
(short completions, one at a time), and how long the server took to exit after SIGINT, with ratios
to plain vLLM; the telemetry each arm could not deliver is read from the servers' own exit lines.
``--soak-s`` then runs one server with the chosen collector fault under steady traffic and samples
the resident memory of all its processes: flat means the exporter queues stay bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from otel_ttft.tools.replay.server import VllmServer, free_port, telemetry_env
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model
from tests.collector_faults import FlappingCollector, SilentCollector

ARMS = ("plain", "live", "dead", "slow", "flapping")
_NOT_DELIVERED = re.compile(r"not delivered: (.*)$")
_COUNT = re.compile(r"(\d+) (spans|metrics) \((\w+)\)")


def complete(server: VllmServer, model: Path, i: int) -> float:
    body = json.dumps({"model": str(model), "prompt": f"request {i}", "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
    return time.monotonic() - t0


def not_delivered(log: Path) -> dict[str, int]:
    """Sum of the per-process 'not delivered' exit lines: '<signal> (<reason>)' -> count."""
    total: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = _NOT_DELIVERED.search(line)
        if found:
            for n, sig, reason in _COUNT.findall(found.group(1)):
                key = f"{sig} ({reason})"
                total[key] = total.get(key, 0) + int(n)
    return total


def one_run(model: Path, arm: str, endpoint: str, extra: tuple[str, ...], log: Path,
            requests: int) -> dict:
    env = {**telemetry_env(endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200",
           "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    server = VllmServer(model, env=env, instrument=arm != "plain", extra_args=extra, log_path=log)
    t0 = time.monotonic()
    server.start(timeout_s=600)
    up = time.monotonic() - t0
    try:
        latencies = [complete(server, model, i) for i in range(requests)]
    finally:
        t1 = time.monotonic()
        code = server.stop(timeout_s=120)
        exit_s = time.monotonic() - t1
    return {"up": up, "request": statistics.median(latencies) if latencies else float("nan"),
            "exit": exit_s, "code": code, "dropped": not_delivered(log)}


def group_rss_mib(pgid: int) -> float:
    """Resident memory of every process in the group, MiB."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total / 1024


def soak(model: Path, endpoint: str, extra: tuple[str, ...], log: Path, seconds: float) -> dict:
    env = {**telemetry_env(endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200",
           "OTEL_METRIC_EXPORT_INTERVAL": "1000"}
    server = VllmServer(model, env=env, extra_args=extra, log_path=log)
    server.start(timeout_s=600)
    pgid = os.getpgid(server.pid)
    samples: list[tuple[float, float]] = []
    latencies: list[float] = []
    t0 = time.monotonic()
    next_sample = t0
    i = 0
    try:
        while time.monotonic() - t0 < seconds:  # bounded by time, one request at a time
            latencies.append(complete(server, model, i))
            i += 1
            if time.monotonic() >= next_sample:
                samples.append((time.monotonic() - t0, group_rss_mib(pgid)))
                next_sample += 30
        samples.append((time.monotonic() - t0, group_rss_mib(pgid)))
    finally:
        t1 = time.monotonic()
        server.stop(timeout_s=120)
        exit_s = time.monotonic() - t1
    settled = [rss for t, rss in samples if t >= 60] or [samples[-1][1]]
    return {"requests": i, "samples": samples, "rss_first_mib": settled[0],
            "rss_last_mib": settled[-1], "rss_max_mib": max(settled),
            "request_median": statistics.median(latencies), "exit": exit_s,
            "dropped": not_delivered(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile)")
    parser.add_argument("--requests", type=int, default=20, help="requests per start (bounded)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)}")
    parser.add_argument("--soak-s", type=float, default=0, help="soak seconds (0: no soak)")
    parser.add_argument("--soak-arm", default="slow", choices=ARMS[2:])
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if any(a not in ARMS for a in arms):
        parser.error(f"--arms: choose from {','.join(ARMS)}")
    model = ensure_tiny_model()
    extra = ("--enforce-eager",) if args.eager else ()
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        receiver = stack.enter_context(OTLPReceiver(SpanStore(Path(tmp) / "store")))
        silent = stack.enter_context(SilentCollector())
        flapping = stack.enter_context(FlappingCollector(Path(tmp) / "flapping"))
        endpoints = {"plain": receiver.http_endpoint, "live": receiver.http_endpoint,
                     "dead": f"http://127.0.0.1:{free_port()}", "slow": silent.endpoint,
                     "flapping": flapping.endpoint}
        for rnd in range(args.rounds):
            order = arms if rnd % 2 == 0 else list(reversed(arms))
            for arm in order:
                log = Path(tmp) / f"{arm}-{rnd}.log"
                res = one_run(model, arm, endpoints[arm], extra, log, args.requests)
                results[arm].append(res)
                print(f"round {rnd} {arm:>8}: healthy after {res['up']:6.1f} s, request "
                      f"{res['request'] * 1e3:6.1f} ms, exit {res['exit']:5.2f} s "
                      f"(code {res['code']}), not delivered {res['dropped'] or '-'}", flush=True)
        med = {arm: {k: statistics.median(r[k] for r in runs) for k in ("up", "request", "exit")}
               for arm, runs in results.items()}
        worst = {arm: max(r["exit"] for r in runs) for arm, runs in results.items()}
        ref = "live" if "live" in med else arms[0]
        base = med["plain"] if "plain" in med else med[ref]
        print(f"\nmedians; ratios to plain vLLM and to instrumented with a live collector ({ref}); "
              "exit: median and worst, seconds over plain's median")
        print("arm       start (s) /plain /live  request (ms) /plain /live  exit med  worst  "
              "not delivered (all rounds)")
        for arm, runs in results.items():
            m = med[arm]
            dropped: dict[str, int] = {}
            for r in runs:
                for key, n in r["dropped"].items():
                    dropped[key] = dropped.get(key, 0) + n
            print(f"{arm:<8} {m['up']:9.1f} {m['up'] / base['up']:6.2f} "
                  f"{m['up'] / med[ref]['up']:5.2f}  {m['request'] * 1e3:12.1f} "
                  f"{m['request'] / base['request']:6.2f} {m['request'] / med[ref]['request']:5.2f}"
                  f"  {m['exit'] - base['exit']:+8.2f} {worst[arm] - base['exit']:+6.2f}"
                  f"  {dropped or '-'}")
        if args.soak_s > 0:
            log = Path(tmp) / f"soak-{args.soak_arm}.log"
            res = soak(model, endpoints[args.soak_arm], extra, log, args.soak_s)
            print(f"\nsoak, {args.soak_arm} collector, {args.soak_s:.0f} s, {res['requests']} "
                  f"requests (median {res['request_median'] * 1e3:.1f} ms):")
            print("  RSS of all server processes (MiB) at " + ", ".join(
                f"{t:.0f}s={rss:.0f}" for t, rss in res["samples"]))
            print(f"  after the first minute: first {res['rss_first_mib']:.0f} MiB, last "
                  f"{res['rss_last_mib']:.0f} MiB, max {res['rss_max_mib']:.0f} MiB "
                  f"({(res['rss_last_mib'] / res['rss_first_mib'] - 1) * 100:+.1f}%); exit "
                  f"{res['exit']:.2f} s; not delivered {res['dropped'] or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
