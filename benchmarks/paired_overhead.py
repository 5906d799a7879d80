"""Our hooks' cost in the API server's CPU per request, with the machine's noise paired out: two
identical otel-ttft servers (``A``, ``B``) serve the same load **at the same time**, their API
processes sharing one CPU, one as ``ours`` and the other as the reference; the next round swaps
the roles (a crossover). Three comparisons (``--compare``), each a cell per load:

- ``untraced``: ours / plain, requests without a ``traceparent``;
- ``traced``: ours / plain, every request with a sampled ``traceparent`` (as behind a traced
  gateway: every request gets our span);
- ``vllm``: ours / vLLM's own request tracing, traced requests: the reference is plain vLLM
  with its tracing on, as ``--otlp-traces-endpoint`` sets it, exporting to the same receiver.

The states are switched inside each server's API process between runs (``api_probe.py``'s
``SIGUSR1``): ``ours`` has our hooks on and vLLM's tracing off (what a user of ours runs);
``plain`` has our hooks off (every wrapper undone, as ``uninstrument`` does); ``vLLM's tracing``
has our hooks off and vLLM's tracing on, with vLLM's own tracer provider built by vLLM's own
``init_otel_tracer`` (a ``BatchSpanProcessor`` and the OTLP/HTTP exporter). Every state keeps the
SDK providers ``opentelemetry-instrument`` built (idle without our hooks) and EngineCore's hooks
(EngineCore is not switched: ``request_overhead.py`` gives its cost against plain vLLM).

Why: run one after the other (``request_overhead.py``), one 100-request run of the same process
in the same state varies by about ±8 % here (a 2-core VM whose host takes its CPUs away
unannounced: the guest counts no steal time, so a descheduled vCPU's time is charged to whatever
ran on it), and resolving a 2 % cost takes on the order of a hundred and fifty runs per arm and
cell. Run at the same time on the same CPU, both arms pay the same stolen time, the same cache
sweeps of the worker next door and the same host load, slice by slice: a round's ratio
keeps our hooks' cost and loses most of that noise. A server also keeps a speed of its own for
its whole life (two identical servers differ by 5-50 % in API CPU per request here): the
crossover divides it out, as each pair of rounds (A ours, B reference; then the other way)
gives the geometric mean of its two ratios, in which A's and B's own speeds cancel.

Each run is time-boxed: both servers take requests in a closed loop (``cN``: N at a time each)
until the same deadline, then finish those in flight; CPU-seconds of each API process (its
POSIX CPU clock) from just before the start to ``--settle-s`` after the last reply (our batched
emission) and an export of every span ended so far (the tracer providers' ``force_flush``:
each run pays for sending its own spans), over the requests it completed. ``--null`` puts
both servers in the reference state, labelled as the crossover would: the method's own floor,
what a pair of rounds reads when there is nothing to find.

Run as root: Linux's autogroup scheduling is turned off for the run and restored after
(``one_scheduling_group``); with it on, one server starved on the shared CPU. Besides API CPU:
the requests each server completed in the same seconds (throughput), the API process's CPU by
thread, its garbage collections and kernel counters per request. Both EngineCores and workers,
the client processes and the receiver run on the other CPU.

Usage: python benchmarks/paired_overhead.py [--rounds 12] [--seconds 8] [--loads c1,c4,c16]
       [--compare untraced,traced,vllm] [--null] [--env KEY=VALUE] [--json FILE]
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

from bench_load import one, parse_pin, run, workload
from bench_servers import make_servers, place, probe_counts, start_all, stop_all, switch
from overhead_figures import median_interval
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
COMPARE = {  # comparison: (traced requests, the reference's state)
    "untraced": (False, {"hooks": "off", "vllm_tracing": "off"}),
    "traced": (True, {"hooks": "off", "vllm_tracing": "off"}),
    "vllm": (True, {"hooks": "off", "vllm_tracing": "on"}),
}
OURS = {"hooks": "on", "vllm_tracing": "off"}
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
    for s, p in zip(servers, probes, strict=True):  # each run sends its own spans
        switch(s, p, flush=True)
    for r, out, cpu0 in zip(roles, outs, before, strict=True):
        out["cpu_s"] = {role: cpu_seconds(pids) - cpu0[role] for role, pids in r.items()}
        out["api_cpu_s"] = out["cpu_s"]["api"]
    for s, out, t0s, c0 in zip(servers, outs, threads_before, counters_before, strict=True):
        out["api_threads_s"] = api_threads(s.pid, t0s)
        out["api_counters"] = counter_delta(c0, counters(s.pid))
    for s, p, out, gc0 in zip(servers, probes, outs, gc_before, strict=True):
        gc1 = probe_counts(s, p)  # the dump itself is outside the counted window
        if gc0 is not None and gc1 is not None:
            out["gc"] = {key: [(a - b) * scale for a, b in zip(gc1[src], gc0[src], strict=True)]
                         for key, src, scale in (("collections", "collections", 1),
                                                 ("cpu_us", "gc_cpu_s", 1e6))}
    return outs


def api_threads(pid: int, before: dict[int, float]) -> dict[str, float]:
    """The API process's CPU-seconds since ``before``: its main thread (the event loop:
    vLLM's request path and our hooks) and every other thread, by name (the span batch
    processors, the metric reader, vLLM's own)."""
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


def ours_and_ref(rounds: list[dict]):
    """(round, ``ours``'s name, the reference's name) for each round."""
    return [(x, x["on"], SERVERS[1 - SERVERS.index(x["on"])]) for x in rounds]


def per_request(rounds: list[dict], key: str, scale: float = 1.0) -> dict:
    """``key``'s figures of each API process per request (times ``scale``), ours and the
    reference, medians over the rounds: ``threads`` (CPU by thread), ``counters`` (syscalls,
    bytes, minor page faults, main-thread context switches: work the kernel does for it,
    which a Python profiler does not see), ``gc`` (collections per generation, their CPU)."""
    out: dict = {}
    for x, *names in ours_and_ref(rounds):
        for state, name in zip(("ours", "ref"), names, strict=True):
            n = max(x["requests"][name], 1)
            for item, value in ((x.get(key) or {}).get(name) or {}).items():
                values = value if isinstance(value, list) else [value]
                for i, v in enumerate(values):
                    label = item if len(values) == 1 else f"{item}_gen{i}"
                    out.setdefault(state, {}).setdefault(label, []).append(v / n * scale)
    return {state: {k: round(statistics.median(v), 4) for k, v in by.items()}
            for state, by in out.items()}


def geometric_mean(a: float, b: float) -> float:
    return math.sqrt(a * b)


def summary(values: list[float], digits: int = 4) -> dict:
    low, high = median_interval(values)
    return {"median": round(statistics.median(values), digits) if values else None,
            "median_95ci": [low, high], "values": [round(v, digits) for v in values]}


def cell_figures(rounds: list[dict], null: bool) -> dict:
    """One (load, comparison) cell: ours / reference API CPU per request, per round and per
    crossover pair (each pair's geometric mean: the servers' own speeds cancel), and the
    difference in us per request (each pair's mean); throughput; the per-request accounting."""
    ratios = [x["ratio"] for x in rounds]
    diffs = [(x["api_ms_per_request"][o] - x["api_ms_per_request"][r]) * 1e3
             for x, o, r in ours_and_ref(rounds)]
    served = [x["requests"][o] / max(x["requests"][r], 1) for x, o, r in ours_and_ref(rounds)]
    pairs = range(0, len(rounds) - 1, 2)
    return {
        "per_round": summary(ratios),
        "per_pair": summary([geometric_mean(ratios[i], ratios[i + 1]) for i in pairs]),
        "difference_us_per_pair": summary([(diffs[i] + diffs[i + 1]) / 2 for i in pairs], 1),
        "throughput_per_pair": summary([geometric_mean(served[i], served[i + 1])
                                        for i in pairs]),
        "a_over_b_same_state": summary(
            [x["api_ms_per_request"]["ours"] / x["api_ms_per_request"]["ours2"]
             for x in rounds]) if null else None,
        "ref_api_ms_per_request_median": round(statistics.median(
            x["api_ms_per_request"][r] for x, _, r in ours_and_ref(rounds)), 3),
        "gc_per_request_median": per_request(rounds, "gc"),
        "api_us_per_request_by_thread_median": per_request(rounds, "threads", 1e6),
        "api_counters_per_request_median": per_request(rounds, "counters"),
        "rounds": rounds}


def vllm_against_plain(cells: dict) -> dict:
    """Per load, per crossover pair: vLLM's own tracing over plain, (ours / plain) over
    (ours / vLLM's tracing) of the same pair of rounds, and ours traced minus it, in units of
    plain: how far ours traced is from vLLM's own tracing arm."""
    out = {}
    for cell, f in cells.items():
        load, compare = cell.split("/")
        other = cells.get(f"{load}/traced")
        if compare != "vllm" or other is None:
            continue
        traced, vllm = other["per_pair"]["values"], f["per_pair"]["values"]
        own = [t / v for t, v in zip(traced, vllm, strict=True)]
        out[load] = {"vllm_over_plain": summary(own),
                     "ours_minus_vllm_in_plain": summary(
                         [t - o for t, o in zip(traced, own, strict=True)])}
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12,
                    help="rounds (even: every pair of rounds is one crossover)")
    ap.add_argument("--seconds", type=float, default=8.0, help="time box of each run")
    ap.add_argument("--loads", default="c1,c4,c16", help="comma list of cN (closed loops)")
    ap.add_argument("--compare", default="untraced,traced,vllm",
                    help="untraced, traced (ours / plain), vllm (ours / vLLM's own tracing, "
                         "traced requests): comma list")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--settle-s", type=float, default=1.5,
                    help="CPU counted this long after the last reply (the batched emission), "
                         "then the spans' export")
    ap.add_argument("--null", action="store_true",
                    help="both servers in the reference state, labelled as the crossover "
                         "would: the floor")
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
    args.loads = [x for x in args.loads.split(",") if x]
    for load in args.loads:
        if not load.startswith("c") or not load[1:].isdigit() or int(load[1:]) < 1:
            raise SystemExit(f"--loads: {load!r} is not cN (a closed loop of N streams)")
    args.compare = [x for x in args.compare.split(",") if x]
    if not args.compare or not set(args.compare) <= set(COMPARE):
        raise SystemExit(f"--compare: a comma list of {', '.join(COMPARE)}")
    return args


def warm_vllm_tracing(pair: list, work: Path, model: str, prompts: list[list[int]],
                      max_tokens: int) -> None:
    """vLLM's own tracing on in each server once, before anything is measured: its provider is
    built (in both, so both carry its idle export thread alike) and its first span and export
    paid; then the server is put back in the ours state."""
    for name, server in zip(SERVERS, pair, strict=True):
        switch(server, work / f"{name}.gc.json", **COMPARE["vllm"][1])
        run(server, model, prompts[:32], max_tokens, "c4", True)
        switch(server, work / f"{name}.gc.json", flush=True, **OURS)


def main() -> None:
    args = parse_args()
    placement = parse_pin(args.pin)
    model_dir = ensure_tiny_model()
    model = str(model_dir)
    prompts = workload(300)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-paired-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    servers = make_servers(list(SERVERS), model_dir, work, receiver.http_endpoint,
                           dict(item.split("=", 1) for item in args.env), placement, probe=True,
                           vllm_traces=f"{receiver.http_endpoint}/v1/traces")
    cells = list(itertools.product(args.loads, args.compare))
    per_round: dict[str, list[dict]] = {f"{load}/{c}": [] for load, c in cells}
    probes = [work / f"{name}.gc.json" for name in SERVERS]
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(one_scheduling_group())
        if placement:
            pin([os.getpid()], placement[1])
        start_all(servers, model, prompts, args.max_tokens, placement)
        pair = [servers[name] for name in SERVERS]
        for server in pair:
            pause(server, False)
            if placement:
                place(server, placement)
        for server in pair:  # the code the servers run: this checkout's, or say so
            print(next((line for line in server.log_path.read_text().splitlines()
                        if line.startswith("api_probe: otel_ttft from")), "api_probe: ?"))
        warm_vllm_tracing(pair, work, model, prompts, args.max_tokens)
        for r in range(args.rounds):
            on = r % 2  # A is ours in even rounds, B in odd ones
            for load, compare in cells:
                traced, ref_state = COMPARE[compare]
                for i, (server, probe) in enumerate(zip(pair, probes, strict=True)):
                    switch(server, probe, **(OURS if i == on and not args.null else ref_state))
                outs = together(pair, model, prompts, args.max_tokens, int(load[1:]), traced,
                                args.seconds, args.settle_s, probes)
                cpu = [o["api_cpu_s"] / max(o["requests"], 1) for o in outs]
                ratio = cpu[on] / cpu[1 - on]
                by_server = dict(zip(SERVERS, outs, strict=True))
                per_round[f"{load}/{compare}"].append({
                    "on": SERVERS[on], "ratio": ratio,
                    "api_ms_per_request": {n: c * 1e3 for n, c in zip(SERVERS, cpu,
                                                                      strict=True)},
                    **{key: {n: o.get(field) for n, o in by_server.items()} for key, field in (
                        ("requests", "requests"), ("gc", "gc"), ("threads", "api_threads_s"),
                        ("counters", "api_counters"))}})
                print(f"round {r:2d} {load:4s} {compare:8s} ours={SERVERS[on]:5s} "
                      f"A {cpu[0] * 1e3:5.2f} ms/req ({outs[0]['requests']:3d})  "
                      f"B {cpu[1] * 1e3:5.2f} ms/req ({outs[1]['requests']:3d})  "
                      f"ours/ref {ratio:.3f}  EngineCore+worker s A "
                      f"{outs[0]['cpu_s']['engine'] + outs[0]['cpu_s']['worker']:.2f} B "
                      f"{outs[1]['cpu_s']['engine'] + outs[1]['cpu_s']['worker']:.2f}  "
                      f"load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        stop_all(servers)
        receiver.stop()
        stack.close()

    figures: dict = {"rounds": args.rounds, "seconds": args.seconds, "null": args.null,
                     "env": args.env, "max_tokens": args.max_tokens,
                     "cells": {cell: cell_figures(rounds, args.null)
                               for cell, rounds in per_round.items()}}
    figures["vllm_against_plain"] = vllm_against_plain(figures["cells"])
    if args.json:
        tmp = Path(f"{args.json}.tmp")
        tmp.write_text(json.dumps(figures, indent=2))
        tmp.replace(args.json)
    report(figures)


def report(figures: dict) -> None:
    def interval(s: dict, fmt: str = ".3f") -> str:
        low, high = s["median_95ci"]
        span = "-" if low is None else f"{low:{fmt}}-{high:{fmt}}"
        return f"{s['median']:{fmt}} [{span}]"

    print(f"\n{'null: both in the reference state; ' if figures['null'] else ''}API CPU per "
          "request, ours / reference in the same round (median, 95 % interval; untraced and "
          "traced: the reference is plain, vllm: vLLM's own tracing):")
    for cell, f in figures["cells"].items():
        pairs = ", ".join(f"{v:.3f}" for v in f["per_pair"]["values"])
        print(f"  {cell:14s} per round {interval(f['per_round'])}  per crossover pair "
              f"{interval(f['per_pair'])} ({pairs})"
              f"  difference {interval(f['difference_us_per_pair'], '+.1f')} us/request; "
              f"reference {f['ref_api_ms_per_request_median']:.2f} ms/request; requests served "
              f"ours / reference {f['throughput_per_pair']['median']:.3f}; garbage collection "
              f"{f['gc_per_request_median']}; API CPU by thread, us per request "
              f"{f['api_us_per_request_by_thread_median']}; per request "
              f"{f['api_counters_per_request_median']}")
    for load, f in figures["vllm_against_plain"].items():
        print(f"  {load:4s} vLLM's own tracing / plain {interval(f['vllm_over_plain'])}; ours "
              f"traced minus it, in plain's units {interval(f['ours_minus_vllm_in_plain'])}")


if __name__ == "__main__":
    main()
