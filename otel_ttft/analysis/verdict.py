"""The verdict: which stage made a scenario's first token slower than the baseline, and what to do.

The article's rule: walk the stages in pipeline order and blame the **earliest that expanded
materially** against the baseline (warm, resident, short prompt): beyond the noise measured across
repeats and at least 10 % of the scenario's TTFT increase. Within that stage the sub-stage that
grew most picks the fix. Two guards keep a switch from being blamed for what it only accompanied:
a load whose bytes read and resident state did not change is not a loading problem, and on a
warm, resident model whose TTFT tracks prompt length or concurrency the verdict is prefill or
queue, with a note that the switch was only correlated.

"Earliest" is about cause: a slow load delays everything after it, so the stage that expanded
first is the one to fix. The front end (tokenize, detokenize) and the network sit beside that
chain, not in it: a longer prompt also takes longer to tokenize, yet the fix is context policy.
They are named only when they grew more than the stage the walk chose.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from otel_ttft import semconv
from otel_ttft.analysis.breakdown import PIPELINE

MATERIAL_SHARE = 0.10  # of the scenario's TTFT increase
NOISE_FLOOR_S = 0.002  # below this no two runs on one machine are told apart
NOISE_FLOOR_SHARE = 0.05  # of the baseline's TTFT: the floor when repeats are too few to measure
NOISE_K = 3.0  # standard errors of the baseline median a delta must exceed

KEEP_RESIDENT = "keep-resident"
PERSIST_ARTIFACTS = "persist-artifacts"
TUNE_ADMISSION = "tune-admission"
TUNE_CONTEXT = "tune-context"
NONE = "none"

# Stages outside the article's causal chain (load -> warm-up -> queue -> prefill): they never
# make a later stage wait, so pipeline order says nothing about them.
SIDE_STAGES = (semconv.STAGE_FRONTEND, semconv.STAGE_NETWORK)

# sub-stage (or stage family) -> (fix, what to change): DESIGN.md's stage table.
FIXES: dict[str, tuple[str, str]] = {
    semconv.STAGE_SWITCH: (KEEP_RESIDENT, "keep both models resident or route by memory, so a "
                           "request never waits for the previous model to leave"),
    semconv.STAGE_SWITCH_SLEEP: (KEEP_RESIDENT, "keep both models resident (sleep level 1 "
                                 "offload, or enough memory for both) instead of evicting"),
    semconv.STAGE_LOAD: (KEEP_RESIDENT, "keep weights resident (sleep mode or a resident "
                         "process) or use faster storage / a streaming loader"),
    semconv.STAGE_LOAD_READ: (KEEP_RESIDENT, "keep weights resident; otherwise faster storage, "
                              "page cache (prefetch) or a streaming loader"),
    semconv.STAGE_LOAD_INIT: (KEEP_RESIDENT, "keep the model resident"),
    semconv.STAGE_LOAD_PROCESS: (KEEP_RESIDENT, "keep weights resident, or ship pre-quantized "
                                 "checkpoints so post-processing is skipped"),
    semconv.STAGE_LOAD_H2D: (KEEP_RESIDENT, "keep weights on the device (sleep level 1 keeps a "
                             "host copy; pinned memory speeds the copy)"),
    semconv.STAGE_WARMUP: (KEEP_RESIDENT, "keep the serving process resident"),
    semconv.STAGE_WARMUP_PROCESS_START: (KEEP_RESIDENT, "keep the server process alive (sleep "
                                         "mode or a resident process) instead of restarting it"),
    semconv.STAGE_WARMUP_FRONTEND: (KEEP_RESIDENT, "keep the server process alive"),
    semconv.STAGE_WARMUP_DEVICE_INIT: (KEEP_RESIDENT, "keep the process and its device context"),
    semconv.STAGE_WARMUP_PROFILE: (PERSIST_ARTIFACTS, "set the KV-cache size explicitly so the "
                                   "memory profiling run is short, and persist compile caches"),
    semconv.STAGE_WARMUP_COMPILE: (PERSIST_ARTIFACTS, "persist compatible compile artifacts "
                                   "(VLLM_CACHE_ROOT / torch.compile cache on durable storage, "
                                   "same shapes and versions) or warm up before serving"),
    semconv.STAGE_WARMUP_GRAPH_CAPTURE: (PERSIST_ARTIFACTS, "persist artifacts and capture "
                                         "fewer graph sizes (cudagraph_capture_sizes)"),
    semconv.STAGE_WARMUP_KV_ALLOC: (TUNE_ADMISSION, "size the KV budget explicitly "
                                    "(kv-cache memory, gpu-memory-utilization)"),
    semconv.STAGE_WARMUP_ADAPTER: (KEEP_RESIDENT, "keep the adapters resident (more LoRA slots: "
                                   "--max-loras, --max-cpu-loras)"),
    semconv.STAGE_FRONTEND: (NONE, "server front-end tuning (tokenizer, detokenize, API workers);"
                             " not a warm-up problem"),
    semconv.STAGE_QUEUE: (TUNE_ADMISSION, "change admission: fewer concurrent sequences or a "
                          "larger KV budget (max-num-seqs, KV cache size)"),
    semconv.STAGE_PREFILL: (TUNE_CONTEXT, "change context policy: shorter prompts/history, "
                            "prefix caching, chunked-prefill size"),
    semconv.STAGE_NETWORK: (NONE, "client, proxy or network side; not the server"),
}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def spread(values: Sequence[float]) -> float:
    """Robust standard deviation across repeats (1.4826 x the median absolute deviation), 0 with
    fewer than 2: the verdict compares medians, so one outlier (a request that happened to
    compile) must not hide, or make, a verdict."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - mid) for v in values)


def noise(base: Sequence[float], floor: float = NOISE_FLOOR_S) -> float:
    """K standard errors of the baseline's median (1.2533 sigma / sqrt(n)): the noise is what
    repeats of the warm baseline show. The scenario's own spread is not noise: under
    concurrency its requests differ by design (the last one admitted waits longest)."""
    return max(floor, NOISE_K * 1.2533 * spread(base) / math.sqrt(max(len(base), 1)))


def fix_for(substage: str | None, stage: str) -> tuple[str, str]:
    return FIXES.get(substage or stage) or FIXES.get(stage) or (NONE, "")


def verdict(scenario: str, baseline: str, rows: list[dict], base_rows: list[dict]) -> dict:
    """One verdict for ``scenario`` against ``baseline`` from their request records."""
    ttft = [r["client_ttft_s"] for r in rows]
    base_ttft = [r["client_ttft_s"] for r in base_rows]
    increase = median(ttft) - median(base_ttft)
    floor = max(NOISE_FLOOR_S, NOISE_FLOOR_SHARE * median(base_ttft))
    ttft_noise = noise(base_ttft, floor)
    evidence = _evidence(rows, base_rows)
    evidence.update(ttft_delta_s=round(increase, 6), noise_s=round(ttft_noise, 6))
    out = {"scenario": scenario, "baseline": baseline, "stage": NONE, "substage": None,
           "delta_s": round(increase, 6), "recommendation": NONE, "evidence": evidence}
    if increase <= ttft_noise:
        evidence["note"] = (f"TTFT p50 {median(ttft):.3f} s vs {median(base_ttft):.3f} s: no "
                            f"expansion beyond the noise ({ttft_noise:.3f} s)")
        out["summary"] = f"{scenario}: no slower than {baseline}; nothing to change"
        return out
    deltas = {}
    for stage in PIPELINE:
        values = [r["stages"][stage] for r in rows]
        base_values = [r["stages"][stage] for r in base_rows]
        deltas[stage] = (median(values) - median(base_values), noise(base_values, floor))
    skipped = []
    material = [s for s in PIPELINE
                if deltas[s][0] > deltas[s][1] and deltas[s][0] >= MATERIAL_SHARE * increase]
    if semconv.STAGE_LOAD in material and _load_unchanged(evidence):
        material.remove(semconv.STAGE_LOAD)
        skipped.append("load grew but bytes read and resident state did not change: not "
                       "blamed on loading")
    chain = [s for s in material if s not in SIDE_STAGES]
    side = [s for s in material if s in SIDE_STAGES]
    chosen = chain[0] if chain else None
    largest_side = max(side, key=lambda s: deltas[s][0], default=None)
    if largest_side and (chosen is None or deltas[largest_side][0] > deltas[chosen][0]):
        chosen = largest_side
    elif largest_side:
        skipped.append(f"{largest_side} also grew (+{deltas[largest_side][0]:.3f} s), less "
                       f"than {chosen}")
    if chosen is None:  # spread thin over several stages: name the one that grew most
        chosen = max(PIPELINE, key=lambda s: deltas[s][0])
        skipped.append("no single stage grew by 10 % of the increase; naming the largest")
    substage = _largest_substage(chosen, rows, base_rows)
    fix, advice = fix_for(substage, chosen)
    delta = deltas[chosen][0]
    notes = skipped + _correlation_note(chosen, rows, base_rows, evidence)
    evidence["stage_noise_s"] = round(deltas[chosen][1], 6)
    evidence["stage_deltas_s"] = {s: round(d, 6) for s, (d, _) in deltas.items()}
    if notes:
        evidence["note"] = "; ".join(notes)
    out.update(stage=chosen, substage=substage, delta_s=round(delta, 6), recommendation=fix)
    out["summary"] = (f"{scenario}: TTFT +{increase:.3f} s over {baseline}; earliest stage that "
                      f"expanded: {chosen} +{delta:.3f} s"
                      + (f" (most in {substage})" if substage and substage != chosen else "")
                      + f" -> {fix}: {advice}")
    return out


def _largest_substage(stage: str, rows: list[dict], base_rows: list[dict]) -> str | None:
    keys = {k for r in (*rows, *base_rows) for k in r["substages"]
            if semconv.stage_family(k) == stage}
    if not keys:
        return None

    def grew(key: str) -> float:
        return (median([r["substages"].get(key, 0.0) for r in rows])
                - median([r["substages"].get(key, 0.0) for r in base_rows]))
    return max(sorted(keys), key=grew)


def _evidence(rows: list[dict], base_rows: list[dict]) -> dict:
    def ev(rs: list[dict], key: str) -> list:
        return [r["evidence"][key] for r in rs if r["evidence"].get(key) is not None]

    def resident_share(rs: list[dict]) -> float:
        return sum(bool(r["evidence"]["model_was_resident"]) for r in rs) / max(len(rs), 1)

    hits = ev(rows, "compile_cache_hit")
    ratios = ev(rows, "page_cache_resident_ratio")
    return {
        "n": len(rows), "baseline_n": len(base_rows),
        "bytes_read_p50": median(ev(rows, "bytes_read")),
        "baseline_bytes_read_p50": median(ev(base_rows, "bytes_read")),
        "page_cache_resident_ratio_p50": round(median(ratios), 4) if ratios else None,
        "compile_cache_hit": (all(hits) if hits else None),
        "model_was_resident_share": round(resident_share(rows), 4),
        "baseline_model_was_resident_share": round(resident_share(base_rows), 4),
        "prompt_tokens_p50": median([r["prompt_tokens"] for r in rows
                                     if r["prompt_tokens"] is not None]),
        "baseline_prompt_tokens_p50": median([r["prompt_tokens"] for r in base_rows
                                              if r["prompt_tokens"] is not None]),
    }


def _load_unchanged(evidence: dict) -> bool:
    return (evidence["bytes_read_p50"] == evidence["baseline_bytes_read_p50"]
            and evidence["model_was_resident_share"]
            == evidence["baseline_model_was_resident_share"])


def _correlation_note(stage: str, rows: list[dict], base_rows: list[dict], evidence: dict
                      ) -> list[str]:
    """The article's failure boundary: a warm, resident model whose TTFT tracks prompt length
    or concurrency. Any switch there is only correlated."""
    if stage not in (semconv.STAGE_PREFILL, semconv.STAGE_QUEUE):
        return []
    if evidence["model_was_resident_share"] < 1.0:
        return []
    tokens, base_tokens = evidence["prompt_tokens_p50"], evidence["baseline_prompt_tokens_p50"]
    waiting = median([r["waiting_at_arrival"] for r in rows
                      if r.get("waiting_at_arrival") is not None])
    base_waiting = median([r["waiting_at_arrival"] for r in base_rows
                           if r.get("waiting_at_arrival") is not None])
    evidence["waiting_at_arrival_p50"] = waiting
    evidence["baseline_waiting_at_arrival_p50"] = base_waiting
    tracks = []
    if tokens > base_tokens:
        tracks.append(f"prompt tokens ({base_tokens:g} -> {tokens:g})")
    if waiting > base_waiting:
        tracks.append(f"requests waiting at arrival ({base_waiting:g} -> {waiting:g})")
    what = " and ".join(tracks) or "load on the server"
    return [f"the model was resident and warm: TTFT tracks {what}; a model switch here is only "
            f"correlated, {stage} is the direct cause"]
