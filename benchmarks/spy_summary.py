"""Summaries of ``py-spy record --format raw`` output for the end-to-end benchmark's
``--profile``: who is on the CPU (our code, the SDK and exporter, vLLM), by share of samples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

# py-spy names a file by its path under the sys.path entry it came from ("(otel_ttft/...py:12)"),
# or in full when it is under none: a key matches either way.
_BUCKETS = (  # first match, innermost Python frame: who is on CPU
    ("otel_ttft", "otel_ttft/"),
    ("otel_exporter", "opentelemetry/exporter/"),
    ("otel_proto_encode", "google/protobuf/"),
    ("otel_sdk", "opentelemetry/sdk/"),
    ("otel_api", "opentelemetry/"),
    ("wrapt", "wrapt/"),
)
_VLLM_SIDE = ("vllm/", "starlette/", "uvicorn/", "fastapi/")  # what our wrappers call


def summarise(path: Path, top: int = 25) -> dict:
    """Share of on-CPU samples by owner (the innermost Python frame's package), the share of
    samples under a frame of ours whose own work is ours or the SDK's (not vLLM's function that
    a wrapper of ours calls), plus the top leaves (native frames included) and our entry
    points."""
    owners: Counter[str] = Counter()
    on_our_behalf = 0
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
        leaves[frames[-1][:120]] += n
        python = [f for f in frames if ".py:" in f]
        leaf = python[-1] if python else frames[-1]
        owners[next((name for name, key in _BUCKETS if key in leaf), "vllm_and_rest")] += n
        mine = [i for i, f in enumerate(python) if "otel_ttft/" in f]
        if mine:
            callee = python[mine[-1] + 1] if mine[-1] + 1 < len(python) else ""
            if not any(key in callee for key in _VLLM_SIDE):
                on_our_behalf += n
            ours[python[mine[0]][:120]] += n
    share = {k: round(100 * v / total, 2) for k, v in owners.most_common()} if total else {}
    return {"samples": total, "owner_pct": share,
            "on_our_behalf_pct": round(100 * on_our_behalf / total, 2) if total else 0.0,
            "threads_pct": {k: round(100 * v / total, 2) for k, v in threads.most_common(8)},
            "our_entry_points_pct": {k: round(100 * v / total, 2)
                                     for k, v in ours.most_common(top)},
            "top_leaves_pct": {k: round(100 * v / total, 2) for k, v in leaves.most_common(top)}}
