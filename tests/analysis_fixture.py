"""Realistic analysis.json documents (the contract ``analyze --json`` writes), built in code.

Six scenarios of a two-model CPU replay, three repeats each; every request's segments tile
[request made, first chunk] in time order, and its stages are the per-family sums of them.
``factor`` scales one substage everywhere (to make a regression for ``check``).
"""

from __future__ import annotations

import hashlib
from statistics import median
from typing import Any

from otel_ttft.tools.analysis.contract import PIPELINE, SCHEMA

WARM = [("frontend", 0.012), ("queue", 0.003), ("prefill", 0.048), ("network", 0.002)]
START = [("warmup.process_start", 3.1), ("warmup.frontend", 0.7), ("warmup.device_init", 0.15),
         ("load.init", 0.3)]
# (substage, seconds) in the order they happen on the one clock.
PROFILES: dict[str, dict[str, Any]] = {
    "cold-switch": {"model": "tiny-qwen2", "prompt": "short", "tokens": 12, "steps": [
        ("switch", 1.3), *START, ("load.read", 2.4), ("load.process", 0.2),
        ("warmup.profile", 0.5), ("warmup.compile", 1.6), ("warmup.kv_alloc", 0.25), *WARM],
        "evidence": {"bytes_read": 181_403_648, "page_cache_resident_ratio": 0.0,
                     "compile_cache_hit": False, "model_was_resident": False}},
    "switch-back": {"model": "tiny-llama", "prompt": "short", "tokens": 12, "steps": [
        ("switch", 1.1), *START, ("load.read", 0.35), ("load.process", 0.1),
        ("warmup.profile", 0.45), ("warmup.compile", 0.3), ("warmup.kv_alloc", 0.2), *WARM],
        "evidence": {"bytes_read": 0, "page_cache_resident_ratio": 1.0,
                     "compile_cache_hit": True, "model_was_resident": False}},
    "resident-dual": {"model": "tiny-qwen2", "prompt": "short", "tokens": 12, "steps": [
        ("frontend", 0.013), ("queue", 0.004), ("prefill", 0.05), ("network", 0.002)],
        "evidence": {"bytes_read": 0, "page_cache_resident_ratio": None,
                     "compile_cache_hit": None, "model_was_resident": True}},
    "short-prompt": {"model": "tiny-llama", "prompt": "short", "tokens": 12, "steps": WARM,
                     "evidence": {"bytes_read": 0, "model_was_resident": True}},
    "long-prompt": {"model": "tiny-llama", "prompt": "long", "tokens": 1900, "steps": [
        ("frontend", 0.02), ("queue", 0.003), ("prefill", 0.92), ("network", 0.002)],
        "evidence": {"bytes_read": 0, "model_was_resident": True}},
    "adapter-switch": {"model": "tiny-llama-lora-b", "prompt": "short", "tokens": 12, "steps": [
        ("frontend", 0.012), ("warmup.adapter", 0.21), ("queue", 0.003), ("prefill", 0.055),
        ("network", 0.002)],
        "evidence": {"bytes_read": 9_437_184, "model_was_resident": True}},
}
VERDICTS = [
    ("cold-switch", "switch", None, "keep-resident",
     {"note": "switch, load and process start all expanded; the switch came first"}),
    ("switch-back", "switch", None, "keep-resident",
     {"note": "caches survived: load.read small, compile cache hit"}),
    ("resident-dual", "queue", None, "none", {"note": "no stage beyond noise"}),
    ("long-prompt", "prefill", None, "tune-context",
     {"note": "TTFT tracks prompt tokens (r=0.99); the model was resident, a switch would only "
              "be correlated", "prompt_tokens": 1900}),
    ("adapter-switch", "warmup", "warmup.adapter", "keep-resident",
     {"note": "adapter load inside the request"}),
]


def _request(name: str, prof: dict[str, Any], i: int, factor: dict[str, float]) -> dict:
    jitter = 1 + 0.04 * (i - 1)
    t, segments = 0.0, []
    stages = dict.fromkeys(PIPELINE, 0.0)
    substages: dict[str, float] = {}
    for sub, secs in prof["steps"]:
        d = round(secs * jitter * factor.get(sub, 1.0), 6)
        family = sub.split(".")[0]
        segments.append({"stage": family, "substage": sub, "start_s": round(t, 6),
                         "duration_s": d})
        stages[family] += d
        if "." in sub:
            substages[sub] = substages.get(sub, 0.0) + d
        t += d
    digest = hashlib.sha256(f"{name}/{i}".encode()).hexdigest()
    return {
        "trace_id": digest[:32], "scenario": name, "model": prof["model"],
        "prompt": prof["prompt"], "repeat_index": i, "prompt_tokens": prof["tokens"],
        "client_ttft_s": round(t, 6), "server_ttft_s": round(t - stages["network"] - 0.001, 6),
        "stages": stages, "substages": substages, "evidence": dict(prof["evidence"]),
        "activation_trace_id": digest[32:64] if stages["load"] else None, "segments": segments,
    }


def summarize(requests: list[dict]) -> dict[str, dict]:
    """The ``scenarios`` block: per-scenario medians, as analyze computes them."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["scenario"] for r in requests):
        rs = [r for r in requests if r["scenario"] == name]
        subs = sorted({k for r in rs for k in r["substages"]})
        out[name] = {
            "n": len(rs), "ttft_p50_s": median(r["client_ttft_s"] for r in rs),
            "stages_p50": {s: median(r["stages"][s] for r in rs) for s in PIPELINE},
            "substages_p50": {k: median(r["substages"].get(k, 0.0) for r in rs) for k in subs},
        }
    return out


def _verdict(scenarios: dict, base: dict, sc: str, stage: str, sub: str | None, rec: str,
             ev: dict) -> dict:
    """A verdict with the evidence analyze writes: stage deltas, reads, shares, the chain."""
    increase = round(scenarios[sc]["ttft_p50_s"] - base["ttft_p50_s"], 6)
    deltas = {s: round(scenarios[sc]["stages_p50"][s] - base["stages_p50"][s], 6)
              for s in PIPELINE}
    chain = [{"stage": s, "substage": None, "delta_s": d, "share": round(d / increase, 4),
              "noise_s": 0.004, "beyond_noise": d > 0.004, "recommendation": rec}
             for s, d in deltas.items() if increase > 0 and d >= 0.1 * increase]
    prof = PROFILES[sc]
    return {
        "scenario": sc, "baseline": "short-prompt", "stage": stage, "substage": sub,
        "delta_s": deltas[stage], "recommendation": rec,
        "outcome": "expanded" if rec != "none" else "within-noise", "chain": chain,
        "summary": f"{sc}: TTFT +{increase:.3f} s over short-prompt; {stage} -> {rec}",
        "evidence": {"n": 3, "baseline_n": 3, "ttft_delta_s": increase, "noise_s": 0.004,
                     "bytes_read_p50": prof["evidence"].get("bytes_read", 0),
                     "baseline_bytes_read_p50": 0,
                     "read_gb_per_s_p50": 0.0756 if prof["evidence"].get("bytes_read") else None,
                     "page_cache_resident_ratio_p50": prof["evidence"].get(
                         "page_cache_resident_ratio"),
                     "model_was_resident_share": 1.0 if prof["evidence"].get(
                         "model_was_resident") else 0.0,
                     "baseline_model_was_resident_share": 1.0,
                     "stage_deltas_s": deltas, **ev},
    }


def build_analysis(factor: dict[str, float] | None = None, repeat: int = 3,
                   concurrency: int = 1) -> dict:
    factor = factor or {}
    requests = [_request(name, prof, i, factor) for name, prof in PROFILES.items()
                for i in range(repeat)]
    scenarios = summarize(requests)
    base = scenarios["short-prompt"]
    verdicts = [_verdict(scenarios, base, *v) for v in VERDICTS]
    return {
        "schema": SCHEMA, "source": "out/demo",
        "run": {"client": "otel-ttft-replay 0.1 / openai chat streaming",
                "sampling": {"temperature": 0, "max_tokens": 8, "seed": 1234},
                "concurrency": concurrency,
                "prompts": {"short": {"tokens": 12, "sha256": "9f2c" * 16},
                            "long": {"tokens": 1900, "sha256": "41ab" * 16}},
                "driver": "restart", "models": ["tiny-llama", "tiny-qwen2"], "repeat": repeat,
                "run_id": "demo-0001"},
        "requests": requests, "scenarios": scenarios, "baseline": "short-prompt",
        "verdicts": verdicts,
    }
