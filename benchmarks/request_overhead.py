"""End-to-end cost of the request path, as an operator sees it at peak: the same fixed workload
against the same tiny model, served by three servers at once -- ``plain`` vLLM (no
``opentelemetry-instrument``, our plugin off), ``sdk`` (``opentelemetry-instrument`` with the SDK
and OTLP exporters, our instrumentor and plugin off) and ``ours`` (otel-ttft on) -- each
exporting over OTLP/HTTP to a live receiver in this process. Every run is one (load, upstream)
cell: closed loop at concurrency 1, 4 and 16 (``c1``, ``c4``, ``c16``) or an open loop at R
requests/s (``rR``); ``untraced`` requests, or ``traced`` ones (each with a sampled
``traceparent``, as behind a traced gateway: parent-based sampling gives every request its span).
In each round every cell runs every arm, in an order that rotates through all six permutations
of the three arms; the two servers not being measured are paused (SIGSTOP to their process
group: an idle vLLM still polls its queues).

The figure that matters is **CPU-seconds per request** of each server process (API server,
EngineCore, worker), read from each process's POSIX CPU clock (nanoseconds; ``/proc``'s ticks are
10 ms, a 1.7 % step at 100 requests of 6 ms) around each run plus a short settle window; each
arm's figure is divided by plain vLLM's of the same round and cell, and the median of those
per-round ratios is reported with its distribution-free 95 % interval and the per-round ratios
beside it. The exporters keep the SDK's defaults (a span batch every 5 s or 512 spans): a batch
still queued when a run ends goes out at the start of that arm's next run, so over the rounds
every span's encoding and sending is counted.

**Placement** (``--pin API:REST``, default ``0:1`` on a machine of two or more CPUs): each API
server alone on the first CPU list, as on a GPU host where it has a core of its own; EngineCore,
the worker (``VLLM_CPU_OMP_THREADS_BIND``) and this client on the other.
Left to the kernel, the API server moves between sharing a core with EngineCore's busy loop and
having one to itself, and the same server's API CPU per request then swings between about 3.5
and 5.7 ms from one run to the next (c4 here): more than any effect this benchmark looks for.

**Two floors, two remedies.** A vLLM server keeps a speed of its own for its whole life: two
identical ``plain`` servers (``--arms plain,plain2``, a control copy) differ here by 10-50 % in API
CPU per request, one process against the other, round after round. ``--fresh`` starts new servers
every round, so that each round draws new processes and the median over rounds is not one
process's luck (at about two and a half minutes of start-ups per round). ``off`` measures what no
pair of servers can: the ``ours`` server's own API process with our hooks switched off
(``api_probe.py``'s ``SIGUSR1``: every wrapper undone, as ``uninstrument`` does, between two
runs), run after run, so ``ours / off`` is our hooks' cost with the process's own speed
divided out. ``off`` still carries the SDK and the exporters (as ``sdk``) and EngineCore's
hooks (EngineCore is not switched).

For the accounting (where the API process's CPU goes, beyond what a Python profiler sees), each
run also records per request: the API server's CPU per thread (its main thread runs vLLM's event
loop and our hooks; the SDK's export threads), its main thread's voluntary context switches (one
per sleep in ``epoll_wait``: extra wake-ups), read/write syscalls and bytes (sockets included: the
ZMQ traffic to EngineCore), minor page faults; with ``--probe``, every server runs under
``api_probe.py`` and each run also records garbage collections per generation and their CPU.
``--profile DIR`` adds unmeasured runs of ``ours`` under ``py-spy record --native`` (raw
collapsed stacks, native frames included), summarised by the share of samples in our code, in
the SDK and exporter, and in vLLM.

Usage: python benchmarks/request_overhead.py [--rounds 12] [--requests 100] [--fresh]
       [--loads c1,c4,c16,r12] [--upstream untraced,traced] [--arms plain,sdk,ours]
       [--max-tokens 16] [--pin 0:1] [--probe] [--profile DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench_load import parse_load, parse_pin, run, workload
from bench_servers import (
    OFF,
    base_arm,
    make_servers,
    place,
    probe_counts,
    start_all,
    stop_all,
    switch,
)
from overhead_figures import cell_figures
from server_counters import (
    counter_delta,
    counters,
    cpu_seconds,
    pause,
    pin,
    processes,
    py_spy,
    thread_cpu,
)
from spy_summary import summarise

from otel_ttft.tools.replay.server import VllmServer
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model


def measured_run(server: VllmServer, model: str, prompts: list[list[int]], max_tokens: int,
                 load: str, traced: bool, settle_s: float, probe: Path | None) -> dict:
    """One run with each process's CPU-seconds and the API server's counters, counted to
    ``settle_s`` after the last reply (a process that started during the run from its start)."""
    gc_before = probe_counts(server, probe) if probe else None
    before = {pid: cpu_seconds([pid]) for pids in processes(server).values() for pid in pids}
    api_before, threads_before = counters(server.pid), thread_cpu(server.pid)
    res = run(server, model, prompts, max_tokens, load, traced)
    time.sleep(settle_s)
    res["cpu_s"] = {role: sum(cpu_seconds([pid]) - before.get(pid, 0.0) for pid in pids)
                    for role, pids in processes(server).items()}
    res["api_threads_s"] = {tid: t - threads_before.get(tid, 0.0)
                            for tid, t in thread_cpu(server.pid).items()}
    res["api_counters"] = counter_delta(api_before, counters(server.pid))
    if gc_before is not None:
        gc_after = probe_counts(server, probe)
        if gc_after is not None:  # the probe's own dump is outside the counted window
            res["gc"] = {key: [a - b for a, b in zip(gc_after[key], gc_before[key], strict=True)]
                         for key in ("collections", "gc_cpu_s", "collected")}
            if gc_after.get("meter", {}).get("metered"):
                res["own_us"] = own_time(gc_before["meter"], gc_after["meter"], res["requests"])
    return res


def own_time(before: dict, after: dict, requests: int) -> dict:
    """Our frames' own CPU in the API server's main thread per request, from ``api_probe.py``'s
    meter: each hook wrapper's time minus vLLM's call inside, what the registry's guards add per
    call (measured in that process), less the timers' own cost; per hook beside it."""
    calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()}
    guard_s, timer_s = after["guard_s"], after["timer_s"]
    total = after["own_s"].get("api_server", 0.0) - before["own_s"].get("api_server", 0.0)
    for key, n in calls.items():
        side, kind = key.split("/")
        if side == "api_server":
            total += n * guard_s.get(kind, -timer_s)  # a free function: its timer
    per = max(requests, 1)
    return {"api_server": total / per * 1e6,
            "by_hook": {h: round((s - before["by_hook_s"].get(h, 0.0)) / per * 1e6, 2)
                        for h, s in after["by_hook_s"].items()}}


def profile(server: VllmServer, roles: dict[str, list[int]], model: str,
            prompts: list[list[int]], args: argparse.Namespace, out: Path) -> dict:
    """Unmeasured runs of each (load, upstream) cell under ``py-spy record --native`` (API server
    and EngineCore), summarised."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for load, upstream in itertools.product(args.loads, args.upstream):
        recorders = []
        for role in ("api", "engine"):
            for pid in roles[role]:
                path = out / f"{load}-{upstream}-{role}-{pid}.txt"
                recorders.append((role, path, subprocess.Popen(
                    [py_spy(), "record", "--nonblocking", "--native", "--threads", "--rate",
                     "200", "--format", "raw", "--output", str(path), "--pid", str(pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(1.0)  # py-spy attaches
        try:
            run(server, model, prompts, args.max_tokens, load, upstream == "traced")
            time.sleep(args.settle_s)
        finally:
            for _, _, proc in recorders:
                proc.send_signal(signal.SIGINT)
            for _, _, proc in recorders:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        summaries.update({f"{load}/{upstream}/{role}:{path.name}": summarise(path)
                          for role, path, _ in recorders if path.exists()})
    return summaries


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12, help="rounds; arm order rotates")
    ap.add_argument("--requests", type=int, default=100, help="requests per run")
    ap.add_argument("--loads", default="c1,c4,c16,r12",
                    help="comma list: cN closed loop at concurrency N, rR open loop R req/s")
    ap.add_argument("--upstream", default="untraced,traced", help="untraced, traced or both")
    ap.add_argument("--arms", default="plain,sdk,ours",
                    help="plain always runs; plain2, ours2...: control copies of an arm; off: "
                         "the ours server's own process with our hooks switched off, run by run")
    ap.add_argument("--fresh", action="store_true",
                    help="new servers every round (a server keeps a speed of its own for its "
                         "whole life: with one server per arm that bias is every round's)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--settle-s", type=float, default=1.5,
                    help="CPU counted this long after each run (the exporter's last batch)")
    ap.add_argument("--probe", action="store_true",
                    help="run every server under api_probe.py: garbage collections per run")
    ap.add_argument("--meter", action="store_true",
                    help="with --arms ...,off: the ours server's hooks metered (api_probe.py): "
                         "our frames' own CPU per request inside the server, by hook; the "
                         "timers cost that process about 1 us per hooked call")
    ap.add_argument("--profile", help="directory: unmeasured runs of ours under py-spy --native")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for the ours server (repeatable)")
    ap.add_argument("--pin", default="0:1" if (os.cpu_count() or 1) >= 2 else "",
                    help="API:REST CPU lists (e.g. 0:1): each API server alone on API, its "
                         "EngineCore, worker and this client on REST; '' "
                         "leaves placement to the kernel")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    placement = parse_pin(args.pin)
    args.loads = [x for x in args.loads.split(",") if x]
    for load in args.loads:
        parse_load(load)
    args.upstream = [x for x in args.upstream.split(",") if x]
    arms = ["plain", *dict.fromkeys(a for a in args.arms.split(",") if a and a != "plain")]
    for arm in arms:
        base_arm(arm)
    if args.meter and OFF not in arms:
        raise SystemExit("--meter: needs the off arm (--arms plain,ours,off)")

    model_dir = ensure_tiny_model()
    model = str(model_dir)
    prompts = workload(args.requests)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-bench-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    extra = dict(item.split("=", 1) for item in args.env)

    def servers_now() -> dict[str, VllmServer]:
        return make_servers(arms, model_dir, work, receiver.http_endpoint, extra, placement,
                            args.probe, args.meter)

    results: dict[tuple[str, str], list[dict]] = {
        cell: [] for cell in itertools.product(args.loads, args.upstream)
        if not (cell[0].startswith("i") and cell[1] != args.upstream[0])}  # idle: upstream moot
    profiles = {}
    load_avg = [os.getloadavg()[0]]
    servers: dict[str, VllmServer] = {}
    try:
        if placement:
            pin([os.getpid()], placement[1])
        orders = list(itertools.permutations(arms))
        for r in range(args.rounds):
            if not servers:
                servers = servers_now()
                names = start_all(servers, model, prompts, args.max_tokens, placement)
                if args.meter:  # the metered hooks replace the instrumentor's, warmed up
                    ours = servers["ours"]
                    pause(ours, False)
                    switch(ours, work / "ours.gc.json", hooks="off")
                    switch(ours, work / "ours.gc.json", hooks="on")
                    run(ours, model, prompts[:32], args.max_tokens, "c4", False)
                    run(ours, model, prompts[:32], args.max_tokens, "c4", True)
                    pause(ours, True)
            for cell in results:
                for arm in orders[r % len(orders)]:
                    server = servers[arm]
                    pause(server, False)
                    if placement:  # again: whatever started since is placed too
                        place(server, placement)
                    if arm == OFF:
                        switch(server, work / "ours.gc.json", hooks="off")
                    try:
                        res = measured_run(server, model, prompts, args.max_tokens,
                                           cell[0], cell[1] == "traced", args.settle_s,
                                           work / f"{'ours' if arm == OFF else arm}.gc.json"
                                           if args.probe or (args.meter and arm == "ours")
                                           else None)
                    finally:
                        if arm == OFF:
                            switch(server, work / "ours.gc.json", hooks="on")
                        pause(server, True)
                    res["arm"] = arm
                    res["threads"] = names[arm]
                    results[cell].append(res)
                    load_avg.append(os.getloadavg()[0])
                    per = res["requests"] or res["wall_s"]
                    cpu = {k: v / per * 1e3 for k, v in res["cpu_s"].items()}
                    unit = "req" if res["requests"] else "s  "
                    print(f"round {r} {cell[0]:4s} {cell[1]:8s} {arm:6s} API {cpu['api']:6.2f} "
                          f"ms/{unit}  EngineCore {cpu['engine']:6.2f}  worker "
                          f"{cpu['worker']:6.2f}  "
                          f"{res['requests'] / res['wall_s']:6.1f} req/s"
                          f"  load {load_avg[-1]:.2f}"
                          + (f"  own {res['own_us']['api_server']:5.1f} us/req"
                             if "own_us" in res else ""), flush=True)
            if args.fresh and r + 1 < args.rounds:
                stop_all(servers)
                servers = {}
        if args.profile and "ours" in servers:
            pause(servers["ours"], False)
            profiles = profile(servers["ours"], processes(servers["ours"]), model, prompts,
                               args, Path(args.profile))
            pause(servers["ours"], True)
    finally:
        stop_all(servers)
        receiver.stop()

    figures = {
        "rounds": args.rounds, "requests_per_run": args.requests, "max_tokens": args.max_tokens,
        "ours_env": extra, "load_average_1m": {"min": min(load_avg), "max": max(load_avg)},
        "fresh_servers_each_round": args.fresh,
        "cells": {f"{load}/{upstream}": cell_figures(res, arms)
                  for (load, upstream), res in results.items()},
        "request_spans_received": sum(1 for s in receiver.store.spans()
                                      if s["name"] == "llm_request"),
        "spans_received": sum(1 for _ in receiver.store.spans()),
    }
    if profiles:
        figures["profile"] = profiles
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    print("\nmedian of per-round ratios to plain vLLM (CPU per request; per second when idle):")
    for cell, f in figures["cells"].items():
        row = "  ".join(f"{arm}: API {fmt(f['cpu_api_ratio'][arm]['median'])} "
                        f"[{fmt(f['cpu_api_ratio'][arm]['median_95ci'][0])}-"
                        f"{fmt(f['cpu_api_ratio'][arm]['median_95ci'][1])}] EngineCore "
                        f"{fmt(f['cpu_engine_ratio'][arm]['median'])}"
                        + (f" throughput {fmt(f['throughput_ratio'][arm]['median'])}"
                           if "throughput_ratio" in f else "")
                        for arm in arms if arm != "plain")
        print(f"  {cell:14s} {row}")
        same = f.get("cpu_api_ours_to_off")
        if same and same["median"] is not None:
            print(f"  {'':14s} ours / off, one process: API {fmt(same['median'])} "
                  f"[{fmt(same['median_95ci'][0])}-{fmt(same['median_95ci'][1])}] "
                  f"{same['difference_ms_median']:+.3f} ms/request")
        own = f.get("own_us_per_request")
        if own:
            print(f"  {'':14s} our frames' own CPU in the API server (metered): "
                  f"{own['median']:.1f} us/request")


if __name__ == "__main__":
    main()
