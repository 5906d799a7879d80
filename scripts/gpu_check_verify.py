"""gpu-check's verify part (issue 19): the changes a CPU machine lists as "not tried here", tried
on the GPU.

A restart-driver replay of cold-switch, switch-back and short-prompt over both tiny models, then
``otel-ttft analyze`` and ``otel-ttft verify``. On a GPU the keep-resident verdicts carry the
sleep-mode change (``--enable-sleep-mode``, the sleep driver, the level from host memory) and a
graph-capture verdict carries ``--cudagraph-capture-sizes`` limited to the observed batch sizes;
``verify`` must try them (status verified or not-verified, never "not tried here") and record
their before/after numbers. What it found is printed; the numbers are the check's output, the
problems its verdict.

Plan of what runs here and nowhere else:
- sleep driver instead of restart (``sleep`` candidate, level 1): vLLM rejects sleep mode on CPU;
- CUDA graph capture sizes (``capture-sizes`` candidate): no graphs on CPU;
- the memory split of two resident servers (``--gpu-memory-utilization`` on ``resident``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from otel_ttft.tools import cli
from otel_ttft.tools.replay.command import run_argv
from otel_ttft.tools.replay.demo import wait_quiet
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore

SCENARIOS = "short-prompt,cold-switch,switch-back"
GPU_ONLY = ("sleep", "capture-sizes")


def check_verifications(doc: dict) -> list[str]:
    """Problems in verify's output on a GPU; empty when every GPU-only change was tried."""
    records = doc.get("verifications") or []
    problems = []
    if not records:
        return ["verify: no verifications recorded"]
    for r in records:
        cid = r["candidate"].get("id")
        if cid in GPU_ONLY and r["status"] == "not-tried":
            problems.append(f"verify: {r['scenario']} {cid} not tried on a GPU: {r['reason']}")
        if r["status"] in ("verified", "not-verified") and r.get("ttft_p50_after_s") is None:
            problems.append(f"verify: {r['scenario']} {cid} has no after TTFT")
    offered = {r["candidate"].get("id") for r in records}
    if "sleep" not in offered:
        problems.append("verify: no sleep-mode change was offered for a keep-resident verdict")
    return problems


def run_verify(out: Path, timeout_s: float) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    store = SpanStore(out / "store")
    with OTLPReceiver(store) as receiver:
        rc = run_argv(["--scenarios", SCENARIOS, "--otlp-endpoint", receiver.http_endpoint,
                       "--out", str(out / "logs"), "--start-timeout", str(timeout_s)])
        with contextlib.suppress(TimeoutError):
            wait_quiet(store)
    if rc != 0:
        return [f"verify: the replay exited {rc}"]
    analysis = out / "analysis.json"
    if cli.main(["analyze", str(out / "store"), "--json", str(analysis)]) != 0:
        return ["verify: analyze failed"]
    rc = cli.main(["verify", str(analysis), "--out", str(out / "verify"), "--max-tries", "3",
                   "--start-timeout", str(timeout_s)])
    verified = out / "verify" / "analysis.json"
    if not verified.exists():
        return [f"verify: exited {rc} without writing {verified}"]
    doc = json.loads(verified.read_text())
    for r in doc["verifications"]:
        print(f"gpu-check: {r['summary']}")
    return ([f"verify: exited {rc}"] if rc else []) + check_verifications(doc)
