"""Start-up cost, side by side in one script: plain vLLM, instrumented with a live collector, and
instrumented with a dead one (nothing listening). Arms alternate so drift hits all of them alike.

    .venv/bin/python benchmarks/startup.py [--rounds 2] [--eager]

Reports time from exec to a healthy ``/health`` per arm (median) and the ratios to plain vLLM, and
how long each server took to exit after SIGINT (a dead collector must not hang the exit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from otel_ttft.replay.demo import telemetry_env
from otel_ttft.replay.server import VllmServer, free_port
from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import SpanStore
from otel_ttft.tiny_model import ensure_tiny_model


def one_start(model: Path, arm: str, endpoint: str, extra: tuple[str, ...], log: Path
              ) -> tuple[float, float, int | None]:
    env = {**telemetry_env(endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    server = VllmServer(model, env=env, instrument=arm != "plain", extra_args=extra, log_path=log)
    t0 = time.monotonic()
    server.start(timeout_s=600)
    up = time.monotonic() - t0
    t1 = time.monotonic()
    code = server.stop(timeout_s=120)
    return up, time.monotonic() - t1, code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile)")
    args = parser.parse_args(argv)
    model = ensure_tiny_model()
    extra = ("--enforce-eager",) if args.eager else ()
    dead = f"http://127.0.0.1:{free_port()}"
    results: dict[str, list[tuple[float, float, int | None]]] = {"plain": [], "live": [],
                                                                 "dead": []}
    with tempfile.TemporaryDirectory() as tmp, \
            OTLPReceiver(SpanStore(Path(tmp) / "store")) as receiver:
        endpoints = {"plain": receiver.http_endpoint, "live": receiver.http_endpoint,
                     "dead": dead}
        for rnd in range(args.rounds):
            order = list(results) if rnd % 2 == 0 else list(reversed(results))
            for arm in order:
                log = Path(tmp) / f"{arm}-{rnd}.log"
                res = one_start(model, arm, endpoints[arm], extra, log)
                results[arm].append(res)
                print(f"round {rnd} {arm:>5}: healthy after {res[0]:6.1f} s, "
                      f"exit took {res[1]:5.1f} s (code {res[2]})", flush=True)
    base = statistics.median(r[0] for r in results["plain"])
    print("\narm     median start  ratio to plain  max exit")
    for arm, runs in results.items():
        med = statistics.median(r[0] for r in runs)
        print(f"{arm:<7} {med:10.1f} s  {med / base:14.3f}  {max(r[1] for r in runs):6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
