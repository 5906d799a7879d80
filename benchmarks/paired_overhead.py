"""Our hooks' cost in the API server's CPU per request, with the machine's noise paired out: two
identical otel-ttft servers (``A``, ``B``) serve the same load **at the same time**, their API
processes sharing one CPU, one with our hooks on and the other with them off
(``api_probe.py``'s ``SIGUSR1``: every wrapper undone, as ``uninstrument`` does); the next round
swaps the roles (a crossover).

Why: run one after the other (``request_overhead.py``), one 100-request run of the same process
in the same state varies by about ±8 % here (a 2-core VM whose host takes its CPUs away
unannounced: the guest counts no steal time, so a descheduled vCPU's time is charged to whatever
ran on it), and resolving a 2 % cost takes on the order of a hundred and fifty runs per arm and
cell. Run at the same time on the same CPU, both arms pay the same stolen time, the same cache
sweeps of the worker next door and the same host load, slice by slice: a round's ratio
keeps our hooks' cost and loses most of that noise. A server also keeps a speed of its own for
its whole life (two identical servers differ by 5-50 % in API CPU per request here): the
crossover divides it out, as each pair of rounds (A on, B off; then A off, B on) gives the
geometric mean of its two ratios, in which A's and B's own speeds cancel.

Each run is time-boxed: both servers take requests in a closed loop (``cN``: N at a time each)
until the same deadline, then finish those in flight; CPU-seconds of each API process (its
POSIX CPU clock) from just before the start to ``--settle-s`` after the last reply (the batched
emission included), over the requests it completed. ``--null`` runs both servers with the hooks
off and labels them as the crossover would: the method's own floor, what a pair of rounds reads
when there is nothing to find.

Run as root: Linux's autogroup scheduling is turned off for the run and restored after
(``one_scheduling_group``); with it on, one server starved on the shared CPU.

Besides API CPU, the requests each server completed in the same seconds (throughput, on / off).
EngineCore is not switched (its hooks are on in both servers): its cost against plain vLLM is
``request_overhead.py``'s. The export processes and the client processes run on the other CPU
with both EngineCores and workers.

Usage: python benchmarks/paired_overhead.py [--rounds 12] [--seconds 8] [--loads c1,c4,c16]
       [--upstream untraced,traced] [--null] [--env KEY=VALUE] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

from bench_load import one, parse_pin, workload
from overhead_figures import median_interval
from request_overhead import (
    make_servers,
    place,
    probe_counts,
    start_all,
    stop_all,
    switch_hooks,
)
from server_counters import (
    counter_delta,
    counters,
    cpu_seconds,
    pause,
    pin,
    processes,
    thread_cpu,
)

from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model

SERVERS = ("ours", "ours2")  # A and B: the same environment, one process each
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


@contextlib.contextmanager
def one_scheduling_group() -> Iterator[None]:
    """Linux's autogroup scheduling off for the run, and back as it was after. Each server runs
    in a session of its own (so that it can be paused as a group), and each session is then a
    scheduling group of its own: with their processes pinned to shared CPUs, one group was
    given the second CPU and the other left waiting on it (4 requests in a 4 s run against 300;
    with autogroup off, 88 against 92)."""
    try:
        before = AUTOGROUP.read_text().strip()
    except OSError:
        before = "0"  # a kernel without it
    if before != "0":
        try:
            AUTOGROUP.write_text("0")
        except OSError as exc:
            raise SystemExit(f"{AUTOGROUP} is {before}: each server would be a scheduling group "
                             f"of its own and starve the other; run as root (or write 0 there "
                             f"first): {exc}") from None
    try:
        yield
    finally:
        if before != "0":
            AUTOGROUP.write_text(before)


def closed_loop(port: int, model: str, prompts: list[list[int]], max_tokens: int,
                concurrency: int, traced: bool, begin: float, deadline: float,
                out: Connection) -> None:
    """``concurrency`` streams taking the prompts in turn from ``begin`` until ``deadline``
    (monotonic, shared by every client process); sends back the requests completed."""
    done = [0]
    lock = threading.Lock()
    next_prompt = itertools.count()

    def stream() -> None:
        while time.monotonic() < deadline:
            one(port, model, prompts[next(next_prompt) % len(prompts)], max_tokens, traced)
            with lock:
                done[0] += 1

    time.sleep(max(0.0, begin - time.monotonic()))
    workers = [threading.Thread(target=stream) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.send((done[0], time.monotonic()))


def together(servers: list, model: str, prompts: list[list[int]], max_tokens: int,
             concurrency: int, traced: bool, seconds: float, settle_s: float,
             probes: list[Path]) -> list[dict]:
    """One time-boxed run of the same load against every server at once, each from a client
    process of its own (in one process, one server's busy streams kept the other's threads
    from the interpreter lock: 4 requests against 200); per server its completed requests and
    its processes' CPU-seconds and its API process's garbage collections (``api_probe.py``)."""
    ctx = multiprocessing.get_context("fork")
    gc_before = [probe_counts(s, p) for s, p in zip(servers, probes, strict=True)]
    roles = [processes(s) for s in servers]
    before = [{role: cpu_seconds(pids) for role, pids in r.items()} for r in roles]
    threads_before = [thread_cpu(s.pid) for s in servers]
    counters_before = [counters(s.pid) for s in servers]
    t0 = time.monotonic()
    begin = t0 + 0.2  # every client process forked and waiting
    pipes, clients = [], []
    for s in servers:
        receive, send = ctx.Pipe(duplex=False)
        clients.append(ctx.Process(target=closed_loop, args=(
            s.port, model, prompts, max_tokens, concurrency, traced, begin, begin + seconds,
            send)))
        pipes.append(receive)
        clients[-1].start()
    outs: list[dict] = []
    for client, receive in zip(clients, pipes, strict=True):
        requests, ended = receive.recv()
        client.join()
        outs.append({"requests": requests, "wall_s": ended - begin})
    time.sleep(settle_s)
    for r, out, cpu0 in zip(roles, outs, before, strict=True):
        out["cpu_s"] = {role: cpu_seconds(pids) - cpu0[role] for role, pids in r.items()}
        out["api_cpu_s"] = out["cpu_s"]["api"]
    for s, out, t0s, c0 in zip(servers, outs, threads_before, counters_before, strict=True):
        out["api_threads_s"] = api_threads(s.pid, t0s)
        out["api_counters"] = counter_delta(c0, counters(s.pid))
    for s, p, out, gc0 in zip(servers, probes, outs, gc_before, strict=True):
        gc1 = probe_counts(s, p)  # the dump itself is outside the counted window
        if gc0 is not None and gc1 is not None:
            out["gc"] = {key: [a - b for a, b in zip(gc1[key], gc0[key], strict=True)]
                         for key in ("collections", "gc_cpu_s")}
    return outs


def api_threads(pid: int, before: dict[int, float]) -> dict[str, float]:
    """The API process's CPU-seconds since ``before``: its main thread (the event loop:
    vLLM's request path and our hooks) and every other thread, by name (the span batch
    processor, the metric reader, the export hand-off, vLLM's own)."""
    out: dict[str, float] = {}
    for tid, cpu in thread_cpu(pid).items():
        if tid == pid:
            name = "main"
        else:
            try:
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                name = "?"
        out[name] = out.get(name, 0.0) + cpu - before.get(tid, 0.0)
    return out


def threads_per_request(rounds: list[dict]) -> dict:
    """API CPU per request by thread (us), hooks on and off, medians over the rounds."""
    out: dict = {}
    for i, x in enumerate(rounds):
        for state, name in (("on", x["on"]), ("off", SERVERS[1 - i % 2])):
            n = max(x["requests"][name], 1)
            for thread, s in (x.get("threads") or {}).get(name, {}).items():
                out.setdefault(state, {}).setdefault(thread, []).append(s / n * 1e6)
    return {state: {t: round(statistics.median(v), 1) for t, v in sorted(
        by.items(), key=lambda kv: -statistics.median(kv[1]))} for state, by in out.items()}


def counters_per_request(rounds: list[dict]) -> dict:
    """The API process's syscalls, bytes, minor page faults and main-thread context switches
    per request (``server_counters.counters``), hooks on and off, medians over the rounds: work
    the kernel does for it, which a Python profiler does not see."""
    out: dict = {}
    for i, x in enumerate(rounds):
        for state, name in (("on", x["on"]), ("off", SERVERS[1 - i % 2])):
            n = max(x["requests"][name], 1)
            for key, value in (x.get("counters") or {}).get(name, {}).items():
                out.setdefault(state, {}).setdefault(key, []).append(value / n)
    return {state: {k: round(statistics.median(v), 2) for k, v in by.items()}
            for state, by in out.items()}


def gc_per_request(rounds: list[dict]) -> dict:
    """The API processes' garbage collections per request (per generation) and their CPU (us per
    request), hooks on and off, medians over the rounds."""
    out: dict = {}
    for i, x in enumerate(rounds):
        for state, name in (("on", x["on"]), ("off", SERVERS[1 - i % 2])):
            gc, n = x["gc"].get(name), max(x["requests"][name], 1)
            if gc:
                out.setdefault(state, []).append(
                    [c / n for c in gc["collections"]] + [sum(gc["gc_cpu_s"]) / n * 1e6])
    return {state: {"collections_per_request": [round(statistics.median(v[g] for v in rows), 4)
                                                for g in range(3)],
                    "gc_us_per_request": round(statistics.median(v[3] for v in rows), 1)}
            for state, rows in out.items()}


def geometric_mean(a: float, b: float) -> float:
    return math.sqrt(a * b)


def summary(values: list[float]) -> dict:
    low, high = median_interval(values)
    return {"median": round(statistics.median(values), 4) if values else None,
            "median_95ci": [low, high], "values": [round(v, 4) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12,
                    help="rounds (even: every pair of rounds is one crossover)")
    ap.add_argument("--seconds", type=float, default=8.0, help="time box of each run")
    ap.add_argument("--loads", default="c1,c4,c16", help="comma list of cN (closed loops)")
    ap.add_argument("--upstream", default="untraced,traced", help="untraced, traced or both")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--settle-s", type=float, default=1.5,
                    help="CPU counted this long after the last reply (the batched emission)")
    ap.add_argument("--null", action="store_true",
                    help="both servers' hooks off, labelled as the crossover would: the floor")
    ap.add_argument("--pin", default="0:1",
                    help="API:REST CPU lists: both API servers on API, the rest on REST")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE for both servers (repeatable): e.g. "
                         "OTEL_TTFT_DISABLED_HOOKS=request.outputs to see what one hook costs")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if any("=" not in item for item in args.env):
        raise SystemExit("--env: KEY=VALUE")
    if args.rounds < 2 or args.rounds % 2:
        raise SystemExit("--rounds: an even number, at least 2 (pairs of crossover rounds)")
    loads = [x for x in args.loads.split(",") if x]
    for load in loads:
        if not load.startswith("c") or not load[1:].isdigit() or int(load[1:]) < 1:
            raise SystemExit(f"--loads: {load!r} is not cN (a closed loop of N streams)")
    upstream = [x for x in args.upstream.split(",") if x]
    if not set(upstream) <= {"untraced", "traced"} or not upstream:
        raise SystemExit("--upstream: untraced, traced or both")
    placement = parse_pin(args.pin)

    model_dir = ensure_tiny_model()
    model = str(model_dir)
    prompts = workload(300)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-paired-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    servers = make_servers(list(SERVERS), model_dir, work, receiver.http_endpoint,
                           dict(item.split("=", 1) for item in args.env), placement, probe=True)
    cells = list(itertools.product(loads, upstream))
    per_round: dict[str, list[dict]] = {f"{load}/{up}": [] for load, up in cells}
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(one_scheduling_group())
        if placement:
            pin([os.getpid()], placement[1])
        start_all(servers, model, prompts, args.max_tokens, placement)
        pair = [servers[name] for name in SERVERS]
        for server in pair:
            pause(server, False)
            if placement:  # the export process starts at the first export
                place(server, placement)
        for r in range(args.rounds):
            on = r % 2  # A on in even rounds, B in odd ones
            for name, server in zip(SERVERS, pair, strict=True):
                want = "on" if (name == SERVERS[on] and not args.null) else "off"
                switch_hooks(server, work / f"{name}.gc.json.switch", want)
            for load, up in cells:
                outs = together(pair, model, prompts, args.max_tokens, int(load[1:]),
                                up == "traced", args.seconds, args.settle_s,
                                [work / f"{name}.gc.json" for name in SERVERS])
                cpu = [o["api_cpu_s"] / max(o["requests"], 1) for o in outs]
                ratio = cpu[on] / cpu[1 - on]
                per_round[f"{load}/{up}"].append({
                    "on": SERVERS[on], "ratio": ratio,
                    "api_ms_per_request": {n: c * 1e3 for n, c in zip(SERVERS, cpu,
                                                                      strict=True)},
                    "requests": {n: o["requests"] for n, o in zip(SERVERS, outs,
                                                                  strict=True)},
                    "gc": {n: o.get("gc") for n, o in zip(SERVERS, outs, strict=True)},
                    "threads": {n: o["api_threads_s"] for n, o in zip(SERVERS, outs,
                                                                      strict=True)},
                    "counters": {n: o["api_counters"] for n, o in zip(SERVERS, outs,
                                                                      strict=True)}})
                print(f"round {r:2d} {load:4s} {up:8s} on={SERVERS[on]:5s} "
                      f"A {cpu[0] * 1e3:5.2f} ms/req ({outs[0]['requests']:3d})  "
                      f"B {cpu[1] * 1e3:5.2f} ms/req ({outs[1]['requests']:3d})  "
                      f"on/off {ratio:.3f}  EngineCore+worker s A "
                      f"{outs[0]['cpu_s']['engine'] + outs[0]['cpu_s']['worker']:.2f} B "
                      f"{outs[1]['cpu_s']['engine'] + outs[1]['cpu_s']['worker']:.2f}  "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        stop_all(servers)
        receiver.stop()
        stack.close()

    figures: dict = {"rounds": args.rounds, "seconds": args.seconds, "null": args.null,
                     "env": args.env,
                     "max_tokens": args.max_tokens, "cells": {}}
    for cell, rounds in per_round.items():
        ratios = [x["ratio"] for x in rounds]
        pairs = [geometric_mean(ratios[i], ratios[i + 1]) for i in range(0, len(ratios), 2)]
        served = [x["requests"][x["on"]] / max(x["requests"][SERVERS[1 - i % 2]], 1)
                  for i, x in enumerate(rounds)]
        off_ms = [x["api_ms_per_request"][SERVERS[1 - i % 2]] for i, x in enumerate(rounds)]
        figures["cells"][cell] = {
            "per_round": summary(ratios),
            "per_pair": summary(pairs),
            "throughput_per_pair": summary([geometric_mean(served[i], served[i + 1])
                                            for i in range(0, len(served), 2)]),
            "a_over_b_same_state": summary(
                [x["api_ms_per_request"]["ours"] / x["api_ms_per_request"]["ours2"]
                 for x in rounds]) if args.null else None,
            "off_api_ms_per_request_median": round(statistics.median(off_ms), 3),
            "gc_per_request_median": gc_per_request(rounds),
            "api_us_per_request_by_thread_median": threads_per_request(rounds),
            "api_counters_per_request_median": counters_per_request(rounds),
            "rounds": rounds}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    print(f"\n{'null: both off; ' if args.null else ''}API CPU per request, hooks on / off "
          "in the same round (median, 95 % interval):")
    for cell, f in figures["cells"].items():
        pr, pp = f["per_round"], f["per_pair"]
        print(f"  {cell:14s} per round {pr['median']:.3f} [{pr['median_95ci'][0]}-"
              f"{pr['median_95ci'][1]}]  per crossover pair {pp['median']:.3f} "
              f"[{pp['median_95ci'][0]}-{pp['median_95ci'][1]}]  "
              f"({', '.join(f'{v:.3f}' for v in pp['values'])}); off "
              f"{f['off_api_ms_per_request_median']:.2f} ms/request; requests served on / off "
              f"{f['throughput_per_pair']['median']:.3f}; garbage collection "
              f"{f['gc_per_request_median']}; API CPU by thread, us per request "
              f"{f['api_us_per_request_by_thread_median']}; per request "
              f"{f['api_counters_per_request_median']}")


if __name__ == "__main__":
    main()
