"""What a traced vLLM server costs in memory under ``opentelemetry-instrument``: PSS summed over
every process of the server's tree, by role, against plain vLLM.

Arms (``bench_servers.ARM_ENV``): ``plain`` (vLLM alone, our plugin off), ``ours``
(``opentelemetry-instrument``, our distro, configurator, instrumentor and plugin, exporting over
OTLP/HTTP to a real receiver in this process), and, with ``--arms plain,sdk,ours``, ``sdk`` (the
same but our instrumentor and plugin off: OpenTelemetry's own share). Each round starts one fresh
server per arm, in an order rotated every round (``plain, ours`` then ``ours, plain``: whatever
drifts over the run falls on both), sends the same ``--requests`` streamed completions with a
sampled ``traceparent`` each (every request traced), waits one span-export interval, then reads
``Pss`` from ``/proc/<pid>/smaps_rollup`` of every process in the server's process group. PSS
divides a shared page among the processes mapping it, so the sum is the tree's share of memory;
but file pages (libtorch, Python's files) are shared with every other process on the machine that
maps them, so that share moves with whatever else runs: the second table, ``Pss_Anon``, is the
tree's own memory and resolves differences of a few MB where the whole PSS does not.

Roles: the API server, EngineCore, its worker(s), multiprocessing's resource tracker, torch
Inductor's compile workers, other. Per role, the mean over rounds of each arm, and of the
difference against ``plain`` with its range over rounds (a round's difference: this round's
server minus this round's plain server).

``--helpers``: instead, the helpers' share alone, in seconds: the command lines a server's helpers
have (multiprocessing's resource tracker, a ``python -c`` probe, neither ever importing vLLM), each
run under ``opentelemetry-instrument`` with our distro (``ours``), under it with nothing of ours
(``bare``: ``OTEL_PYTHON_DISTRO``/``CONFIGURATOR`` pointing nowhere, every instrumentor off) and
as plain Python, alternating, each reporting its own PSS and which modules it loaded.

Usage: python benchmarks/pss.py [--rounds 2] [--requests 200] [--arms plain,ours]
       [--max-tokens 16] [--json FILE]
       python benchmarks/pss.py --helpers [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_load import run, workload
from bench_servers import WARM_EXPORT_S, make_servers
from server_counters import processes

from otel_ttft.tools.replay.server import VllmServer
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model

ROLES = ("api", "engine", "worker", "resource tracker", "compile worker", "other")
LABEL = {"api": "API server", "engine": "EngineCore", "worker": "worker"}


def pss_kb(pid: int) -> dict[str, int] | None:
    """The process's proportional set size (kB): ``Pss``, and its ``Pss_Anon`` part, or None
    if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Pss", "Pss_Anon"):
            found[key] = int(rest.split()[0])
    return found if "Pss" in found else None


def role_of(role: str, pid: int) -> str:
    """``server_counters.processes``' role, with its ``other`` split by command line."""
    if role != "other":
        return role
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    if b"multiprocessing.resource_tracker" in cmdline:
        return "resource tracker"
    if b"compile_worker" in cmdline:
        return "compile worker"
    return "other"


def measure(server: VllmServer) -> dict[str, dict]:
    """PSS (MB: ``mb``, of it anonymous: ``anon_mb``) and process count per role, over the
    server's whole process group."""
    out = {role: {"mb": 0.0, "anon_mb": 0.0, "n": 0} for role in ROLES}
    for role, pids in processes(server).items():
        for pid in pids:
            kb = pss_kb(pid)
            if kb is not None:
                cell = out[role_of(role, pid)]
                cell["mb"] += kb["Pss"] / 1024
                cell["anon_mb"] += kb.get("Pss_Anon", 0) / 1024
                cell["n"] += 1
    return out


def one_run(arm: str, model_dir: Path, work: Path, receiver: OTLPReceiver,
            prompts: list[list[int]], max_tokens: int, round_no: int) -> dict[str, dict]:
    """A fresh server for ``arm``: started, the traced requests, one export interval, measured,
    stopped."""
    (work / f"r{round_no}").mkdir(exist_ok=True)
    server = make_servers([arm], model_dir, work / f"r{round_no}", receiver.http_endpoint, {},
                          None, probe=False)[arm]
    spans_before = len(receiver.store.spans())
    t0 = time.monotonic()
    server.start()
    try:
        started = time.monotonic() - t0
        done = run(server, str(model_dir), prompts, max_tokens, "c4", True)
        time.sleep(WARM_EXPORT_S)  # our batched emission and one span export, then read
        found = measure(server)
    finally:
        server.stop()
    total = sum(cell["mb"] for cell in found.values())
    received = len(receiver.store.spans()) - spans_before
    print(f"round {round_no} {arm:5s}: {done['requests']} requests, start {started:.0f} s, "
          f"{received} spans received, PSS {total:.1f} MB", flush=True)
    return found


def table(arms: list[str], runs: list[dict[str, dict[str, dict]]], key: str = "mb") -> str:
    """Per role: mean MB of each arm over rounds; each other arm minus plain (mean, range over
    rounds) in MB and % of plain's. ``key``: ``mb`` (PSS) or ``anon_mb`` (its anonymous part)."""
    def value(run_: dict, arm: str, role: str | None) -> float:
        cells = run_[arm]
        return sum(c[key] for r, c in cells.items() if role is None or r == role)

    others = [a for a in arms if a != "plain"]
    head = "| role | procs | " + " | ".join(f"{a} MB" for a in arms) + " | " + " | ".join(
        f"{a} - plain MB (range) | %" for a in others) + " |"
    lines = [head, "|" + "---|" * (2 + len(arms) + 2 * len(others))]
    for role in (*ROLES, None):
        if role is not None and not any(r[a][role]["n"] for r in runs for a in arms):
            continue
        procs = "/".join(str(max(r[a][role]["n"] for r in runs)) if role else
                         str(max(sum(c["n"] for c in r[a].values()) for r in runs))
                         for a in arms)
        cells = [f"{statistics.mean(value(r, a, role) for r in runs):.1f}" for a in arms]
        plain = statistics.mean(value(r, "plain", role) for r in runs)
        for a in others:
            diffs = [value(r, a, role) - value(r, "plain", role) for r in runs]
            pct = 100 * statistics.mean(diffs) / plain if plain else float("nan")
            cells += [f"{statistics.mean(diffs):+.1f} ({min(diffs):+.1f} .. {max(diffs):+.1f})",
                      f"{pct:+.2f} %"]
        name = "**total**" if role is None else LABEL.get(role, role)
        lines.append(f"| {name} | {procs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


HELPER_FORMS = {"resource tracker": "from multiprocessing.resource_tracker import main",
                "python -c probe": "import os"}
HELPER_PROBE = """
import json, sys
mods = sys.modules
pss = next(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("Pss:"))
print(json.dumps({"pss_mb": pss / 1024, "modules": len(mods),
                  "ours": sum(m.startswith("otel_ttft") for m in mods),
                  "sdk": sum(m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))
                             for m in mods)}))
"""
HELPER_ARMS = {
    "ours": {},
    "bare": {"OTEL_PYTHON_DISTRO": "none", "OTEL_PYTHON_CONFIGURATOR": "none",
             "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "*"},
    "plain": None,  # no opentelemetry-instrument
}


def helpers(rounds: int) -> None:
    """The helper processes' PSS and modules per arm (``--helpers``), arms alternating."""
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    found: dict[tuple[str, str], list[dict]] = {}
    for round_no in range(rounds):
        arms = list(HELPER_ARMS)
        arms = arms[round_no % 3:] + arms[:round_no % 3]
        for form, code in HELPER_FORMS.items():
            for arm in arms:
                extra = HELPER_ARMS[arm]
                prefix = [] if extra is None else [instrument]
                proc = subprocess.run([*prefix, sys.executable, "-c", code + "\n" + HELPER_PROBE],
                                      capture_output=True, text=True, timeout=120,
                                      env={**base, **(extra or {})})
                found.setdefault((form, arm), []).append(
                    json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{rounds} rounds, arms alternating; PSS in MB (MiB)\n")
    print("| helper | arm | PSS MB (range) | modules | of ours | SDK and exporter |")
    print("|---|---|---|---|---|---|")
    for (form, arm), outs in found.items():
        pss = [o["pss_mb"] for o in outs]
        print(f"| {form} | {arm} | {statistics.median(pss):.1f} ({min(pss):.1f} .. "
              f"{max(pss):.1f}) | {outs[-1]['modules']} | {outs[-1]['ours']} | "
              f"{outs[-1]['sdk']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--arms", default="plain,ours")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--helpers", action="store_true")
    args = parser.parse_args()
    if args.helpers:
        helpers(max(args.rounds, 2))
        return
    arms = args.arms.split(",")
    if "plain" not in arms or len(arms) < 2 or args.rounds < 2:
        raise SystemExit("--arms needs plain and one more; --rounds at least 2 (a crossover)")
    model_dir = ensure_tiny_model()
    prompts = workload(args.requests)
    work = Path(tempfile.mkdtemp(prefix="otel-ttft-pss-"))
    receiver = OTLPReceiver(SpanStore(work / "store")).start()
    runs: list[dict[str, dict[str, dict]]] = []
    try:
        for round_no in range(args.rounds):
            shift = round_no % len(arms)
            order = arms[shift:] + arms[:shift]
            runs.append({arm: one_run(arm, model_dir, work, receiver, prompts, args.max_tokens,
                                      round_no) for arm in order})
    finally:
        receiver.stop()
    print(f"\n{args.rounds} rounds, {args.requests} traced requests per server, "
          f"orders rotated; PSS in MB (MiB) after the load\n")
    print(table(arms, runs))
    # File-backed pages (libtorch, the Python files) are shared with every other process that
    # maps them, other servers on the machine included: their PSS share moves with what else
    # runs. The anonymous part is the tree's own.
    print("\nOf which anonymous (Pss_Anon: not shared with processes outside the tree)\n")
    print(table(arms, runs, "anon_mb"))
    if args.json:
        args.json.write_text(json.dumps({"arms": arms, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
