"""Does the first run after switching our hooks on (or off) pay for the switch? One ``ours``
server under ``api_probe.py``; each round switches the hooks and runs twice in that state, then
switches and runs twice again (``offA offB onA onB``, the next round ``onA onB offA offB``), so
``onA / onB`` is the first run after a switch over the second, in the same state and process. The
end-to-end benchmark's ``ours / off`` would carry any such cost in the rounds where ``off`` runs
just before ``ours``.

Usage: python benchmarks/switch_order.py [--rounds 8] [--requests 100] [--load c4] [--traced]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench_load import parse_load, parse_pin, workload
from bench_servers import make_servers, start_all, stop_all, switch
from request_overhead import measured_run
from server_counters import pause, pin

from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--load", default="c4")
    ap.add_argument("--traced", action="store_true")
    ap.add_argument("--pin", default="0:1")
    args = ap.parse_args()
    parse_load(args.load)
    placement = parse_pin(args.pin)
    if placement:
        pin([os.getpid()], placement[1])
    model_dir = ensure_tiny_model()
    prompts = workload(args.requests)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-order-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    servers = {"ours": make_servers(["plain", "ours", "off"], model_dir, work,
                                    receiver.http_endpoint, {}, placement, False)["ours"]}
    runs: dict[str, list[float]] = {k: [] for k in ("offA", "offB", "onA", "onB")}
    try:
        start_all(servers, str(model_dir), prompts, 16, placement)
        server = servers["ours"]
        pause(server, False)
        for r in range(args.rounds):
            for state in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if state == "on":  # from off, even after a round that ended on: a re-apply
                    switch(server, work / "ours.gc.json", hooks="off")
                switch(server, work / "ours.gc.json", hooks=state)
                for label in ("A", "B"):
                    res = measured_run(server, str(model_dir), prompts, 16, args.load,
                                       args.traced, 1.5, None)
                    runs[state + label].append(res["cpu_s"]["api"] / res["requests"] * 1e3)
                    print(f"round {r} {state + label:4s} API {runs[state + label][-1]:.3f} "
                          "ms/request", flush=True)
    finally:
        stop_all(servers)
        receiver.stop()

    def ratios(a: str, b: str) -> str:
        values = [x / y for x, y in zip(runs[a], runs[b], strict=True)]
        return (f"median {statistics.median(values):.3f} per round "
                + " ".join(f"{v:.2f}" for v in values))

    print(f"onA / onB (first run after switching on / second): {ratios('onA', 'onB')}")
    print(f"offA / offB (first run after switching off / second): {ratios('offA', 'offB')}")
    on = [a + b for a, b in zip(runs["onA"], runs["onB"], strict=True)]
    off = [a + b for a, b in zip(runs["offA"], runs["offB"], strict=True)]
    pairs = [x / y for x, y in zip(on, off, strict=True)]
    print(f"on / off (both runs of each state): median {statistics.median(pairs):.3f} per round "
          + " ".join(f"{v:.2f}" for v in pairs))


if __name__ == "__main__":
    main()
