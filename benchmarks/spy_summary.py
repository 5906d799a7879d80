"""Summaries of ``py-spy record --format raw`` output for the end-to-end benchmark's
``--profile``: who is on the CPU (our code, the SDK and exporter, vLLM), by share of samples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

_BUCKETS = (  # first match, innermost frame first: who is on CPU
    ("otel_ttft", "/otel_ttft/"),
    ("otel_exporter", "opentelemetry/exporter/"),
    ("otel_proto_encode", "google/protobuf/"),
    ("otel_sdk", "opentelemetry/sdk/"),
    ("otel_api", "opentelemetry/"),
    ("wrapt", "/wrapt/"),
)


def summarise(path: Path, top: int = 25) -> dict:
    """Share of on-CPU samples by owner: innermost Python frame's package, our code counted
    wherever it sits on the stack (what we call runs on our behalf), plus the top leaves (native
    frames included) and what our frames call most."""
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
        leaves[frames[-1][:120]] += n
        python = [f for f in frames if ".py:" in f]
        leaf = python[-1] if python else frames[-1]
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
