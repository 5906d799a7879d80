"""The verdict: which stage made a scenario's first token slower than the baseline, and what to do.

The article's rule: walk the stages in pipeline order and blame the **earliest that expanded
materially** against the baseline (warm, resident, short prompt): beyond the noise measured across
repeats and at least 10 % of the scenario's TTFT increase. Within that stage the sub-stage that
grew most picks the fix: in prefill, ``prefill.uncached_prefix`` (prompt tokens the baseline read
from vLLM's prefix cache, computed again after a switch emptied it: ``diagnosis.prefix``) names
the cold cache and the warm-up fix, the rest of prefill context policy. Two guards keep a switch
from being blamed for what it only accompanied: a load whose bytes read and resident state did
not change is not a loading problem, and on a warm, resident model whose TTFT tracks prompt
length or concurrency the verdict is prefill or queue, with a note that the switch was only
correlated.

"Earliest" is about cause: a slow load delays everything after it, so the stage that expanded
first is the one to fix. The front end (tokenize, detokenize) and the network sit beside that
chain, not in it: a longer prompt also takes longer to tokenize, yet the fix is context policy.
They are named only when they grew more than the stage the walk chose.

A verdict is only as good as its noise. The noise is measured on the baseline's repeats; with
fewer than ``MIN_BASELINE_N`` of them it cannot be, and the verdict says so (``undetermined``) and
what to re-run instead of naming a stage from a floor. An increase within the noise is
``none``: no slower than the baseline. Next to the one stage to fix, the verdict lists the
``chain``: every stage that grew by at least 10 % of the increase, in pipeline order, with its
share, so the operator sees what the fix removes and what it leaves.

Where the noise cannot be measured but a decision is wanted all the same (the runtime's live
verdict on an activation with one or two earlier ones of its model on the host), ``thin``
thresholds stand in for it: the alert rules' factor and minimum seconds
(``diagnosis.thresholds``), and the verdict says that its baseline is thin.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from otel_ttft import semconv
from otel_ttft.diagnosis import evidence as ev
from otel_ttft.diagnosis.thresholds import AlertThresholds

PIPELINE = semconv.TTFT_PIPELINE
__all__ = ["EXPANDED", "FIXES", "KEEP_RESIDENT", "MATERIAL_SHARE", "MIN_BASELINE_N",
           "NOISE_FLOOR_S", "NOISE_FLOOR_SHARE", "NOISE_K", "NONE", "PERSIST_ARTIFACTS",
           "PIPELINE", "PLACEMENT", "SIDE_STAGES",
           "TAIL_EXPLAINED_SHARE", "TAIL_FACTOR",
           "TUNE_ADMISSION", "TUNE_CONTEXT", "UNDETERMINED", "WARM_UP", "WITHIN_NOISE", "core",
           "fix_for", "tails", "median", "noise", "rerun_hint", "seconds_text", "spread", "verdict"]

MATERIAL_SHARE = 0.10  # of the scenario's TTFT increase
NOISE_FLOOR_S = 0.002  # below this no two runs on one machine are told apart
NOISE_FLOOR_SHARE = 0.05  # of the baseline's TTFT: the smallest change worth naming
NOISE_K = 3.0  # standard errors of the median difference a delta must exceed
MIN_BASELINE_N = 3  # fewer baseline requests cannot measure a spread

KEEP_RESIDENT = "keep-resident"
PERSIST_ARTIFACTS = "persist-artifacts"
WARM_UP = "warm-up"
TUNE_ADMISSION = "tune-admission"
TUNE_CONTEXT = "tune-context"
PLACEMENT = "placement"
NONE = "none"

# What a verdict concluded (its ``outcome``): a stage expanded; the scenario is no slower than the
# baseline beyond the noise; or the baseline has too few requests to tell.
EXPANDED = "expanded"
WITHIN_NOISE = "within-noise"
UNDETERMINED = "undetermined"

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
    semconv.STAGE_WARMUP_STEP_COMPILE: (WARM_UP, "warm up what serving compiles before routing "
                                        "users: after activation send requests with the same "
                                        "options and shapes (the compile's ttft.compile.frame "
                                        "and ttft.step.tokens name them); a process compiles "
                                        "each once"),
    semconv.STAGE_WARMUP_FIRST_USE: (WARM_UP, "warm up the front end after activation: send a "
                                     "few requests through the chat template and tokenizer "
                                     "before routing users to the new model"),
    semconv.STAGE_FRONTEND: (NONE, "server front-end tuning (tokenizer, detokenize, API workers);"
                             " not a warm-up problem"),
    semconv.STAGE_QUEUE: (TUNE_ADMISSION, "change admission: fewer concurrent sequences or a "
                          "larger KV budget (max-num-seqs, KV cache size)"),
    semconv.STAGE_PREFILL: (TUNE_CONTEXT, "change context policy: shorter prompts/history, "
                            "prefix caching, chunked-prefill size"),
    semconv.STAGE_PREFILL_WAIT: (PLACEMENT, "give the worker CPUs no other process uses (its "
                                 "CPU binding, or another server or job moved off them); the "
                                 "prompt is not the problem, so context policy would not help"),
    semconv.STAGE_PREFILL_UNCACHED_PREFIX: (WARM_UP, "the switch emptied vLLM's prefix "
                                            "cache: send one request with the shared prefix "
                                            "(system prompt, history) after activation, before "
                                            "routing users, or keep the model resident so its "
                                            "cache survives"),
    semconv.STAGE_NETWORK: (NONE, "client, proxy or network side; not the server"),
}


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def spread(values: Sequence[float]) -> float:
    """Robust standard deviation across repeats, 0 with fewer than 2: the larger of 1.4826 x the
    median absolute deviation and the interquartile range / 1.349. Both ignore one outlier (a
    request that happened to compile must not hide, or make, a verdict); the MAD alone
    understates the heavy right tail that a few warm requests have on a busy machine (a late
    flush, a scheduling hiccup in the client): 8 against 8 identical requests were then called
    "expanded" in about one run of five (4.6 ms over a noise of 4.3 ms), where the quartiles put
    the noise at 8 ms."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - mid) for v in values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return max(mad, (q3 - q1) / 1.349)


def noise(base: Sequence[float], floor: float = NOISE_FLOOR_S, *,
          against: int | None = None) -> float:
    """K standard errors (1.2533 sigma / sqrt(n)) of the baseline's median, or, ``against`` a
    scenario of that many requests, of the difference of the two medians (sigma sqrt(1/n +
    1/m)): one request of a scenario varies as much as one of the baseline. Sigma is what the
    warm baseline's repeats show; the scenario's own spread is not noise: under concurrency its
    requests differ by design (the last one admitted waits longest)."""
    n = max(len(base), 1)
    scale = math.sqrt(1 / n + 1 / against) if against else 1 / math.sqrt(n)
    return max(floor, NOISE_K * 1.2533 * spread(base) * scale)


def fix_for(substage: str | None, stage: str) -> tuple[str, str]:
    return FIXES.get(substage or stage) or FIXES.get(stage) or (NONE, "")


def rerun_hint(baseline: str) -> str:
    """What to re-run so the baseline gets enough requests to measure its noise."""
    if baseline in semconv.SCENARIOS_SWITCHING:
        return f"otel-ttft replay --repeat {MIN_BASELINE_N}"
    if baseline in semconv.SCENARIOS:
        return "otel-ttft replay --repeat-warm 5"
    return f"at least {MIN_BASELINE_N} requests of {baseline}"


def verdict(scenario: str, baseline: str, rows: list[dict], base_rows: list[dict], *,
            thin: AlertThresholds | None = None) -> dict:
    """One verdict for ``scenario`` against ``baseline`` from their records (requests, or
    activations taken as one record each). ``thin``: with 1 to ``MIN_BASELINE_N`` - 1 baseline
    records, judge by these thresholds instead of calling the verdict undetermined."""
    ttft = [r["client_ttft_s"] for r in rows]
    base_ttft = [r["client_ttft_s"] for r in base_rows]
    increase = median(ttft) - median(base_ttft)
    floor = max(NOISE_FLOOR_S, NOISE_FLOOR_SHARE * median(base_ttft))
    thin = thin if thin is not None and 0 < len(base_rows) < MIN_BASELINE_N else None
    ttft_noise = thin.min_seconds if thin else noise(base_ttft, floor, against=len(rows))
    evidence = ev.evidence(rows, base_rows)
    evidence.update(ttft_delta_s=round(increase, 6), noise_s=round(ttft_noise, 6))
    # Stage deltas between the requests around each median (the middle half by TTFT): they add
    # up to the TTFT difference of those requests, so shares mean what they say even when a
    # scenario's requests fall into a fast and a slow group (medians of parts do not add up).
    mid, base_mid = core(rows), core(base_rows)
    mid_increase = _mean([r["client_ttft_s"] for r in mid]) - _mean(
        [r["client_ttft_s"] for r in base_mid])
    deltas = {s: (_mean([r["stages"][s] for r in mid])
                  - _mean([r["stages"][s] for r in base_mid]),
                  _thin_noise(s, rows, base_rows, thin) if thin else
                  noise([r["stages"][s] for r in base_rows], floor, against=len(rows)))
              for s in PIPELINE}
    evidence["stage_deltas_s"] = {s: round(d, 6) for s, (d, _) in deltas.items()}
    notes = ev.state_notes(evidence)
    out = {"scenario": scenario, "baseline": baseline, "stage": NONE, "substage": None,
           "delta_s": round(increase, 6), "recommendation": NONE, "evidence": evidence,
           "chain": []}
    p50, base_p50 = median(ttft), median(base_ttft)
    if thin:
        evidence["thin_baseline"] = True
        notes.insert(0, f"thin baseline: {len(base_rows)} earlier record(s), fewer than "
                        f"{MIN_BASELINE_N}, so no measured noise; judged by the alert thresholds "
                        f"(x{thin.factor:g} and +{thin.min_seconds:g} s per stage)")
    if len(base_rows) < MIN_BASELINE_N and not thin:
        notes.insert(0, f"{baseline} has {len(base_rows)} request(s), fewer than "
                        f"{MIN_BASELINE_N}: its noise cannot be measured, so no stage is named")
        evidence["note"] = "; ".join(notes)
        out.update(outcome=UNDETERMINED, summary=(
            f"{scenario}: cannot tell (TTFT p50 {_s(p50)} vs {_s(base_p50)} for {baseline}, "
            f"whose {len(base_rows)} request(s) cannot measure the noise); re-run with "
            f"{rerun_hint(baseline)}"))
        return out
    if increase <= ttft_noise:  # thin: the whole start is within the minimum seconds
        notes.insert(0, f"TTFT p50 {_s(p50)} vs {_s(base_p50)}: no expansion beyond the noise "
                        f"({_s(ttft_noise)})")
        evidence["note"] = "; ".join(notes)
        # what grew all the same, by either measure of the (noise-sized) increase
        grew = [x for x in (increase, mid_increase) if x > 0]
        moved = [s for s in PIPELINE if grew and deltas[s][0] > 0
                 and deltas[s][0] >= MATERIAL_SHARE * min(grew)]
        out.update(outcome=WITHIN_NOISE, summary=(
            f"{scenario}: no slower than {baseline} beyond noise (TTFT {_signed(increase)}, "
            f"noise {_s(ttft_noise)}); nothing to change"
            + ("; moved within the noise: " + ", ".join(
                f"{s} +{_s(deltas[s][0])}" for s in moved) if moved else "")))
        tail = tails(rows, base_rows, ttft_noise)
        if tail is not None:
            out["tail"] = tail
            out["summary"] += "; " + tail["summary"]
        return out
    chain = _chain(deltas, mid_increase, mid, base_mid, least=min(increase, mid_increase))
    chosen, skipped = _walk(deltas, mid_increase, evidence, largest=not thin)
    if chosen is None:  # thin: no stage beyond the thresholds, however the total moved
        notes.insert(0, f"TTFT {_signed(increase)}, but no stage grew beyond the alert "
                        f"thresholds (x{thin.factor:g} and +{thin.min_seconds:g} s)")
        evidence["note"] = "; ".join(notes)
        out.update(outcome=WITHIN_NOISE, chain=chain, summary=(
            f"{scenario}: {_signed(increase)} against {baseline}, no stage beyond the alert "
            f"thresholds (thin baseline: {len(base_rows)} earlier record(s)); nothing to change"))
        return out
    substage = _largest_substage(chosen, mid, base_mid)
    fix, advice = fix_for(substage, chosen)
    delta = deltas[chosen][0]
    notes = skipped + notes + ev.correlation_note(chosen, rows, base_rows, evidence)
    evidence["stage_noise_s"] = round(deltas[chosen][1], 6)
    if notes:
        evidence["note"] = "; ".join(notes)
    out.update(stage=chosen, substage=substage, delta_s=round(delta, 6), recommendation=fix,
               outcome=EXPANDED, chain=chain)
    share = f" ({delta / mid_increase:.0%})" if mid_increase > 0 else ""
    evidence["middle_half_ttft_delta_s"] = round(mid_increase, 6)
    if thin:
        evidence["note"] = "; ".join(notes)
    if abs(mid_increase - increase) > 0.25 * increase:  # two groups of requests, not one
        notes.append(f"its requests are not alike: the middle half by TTFT differs by "
                     f"{_signed(mid_increase)}, the medians by {_signed(increase)}; shares are "
                     f"of the middle half's")
        evidence["note"] = "; ".join(notes)
    out["summary"] = (f"{scenario}: TTFT +{_s(increase)} over {baseline} ("
                      + ("thin baseline, alert thresholds" if thin else f"noise {_s(ttft_noise)}")
                      + f"); earliest stage that expanded: {chosen} "
                      f"+{_s(delta)}{share}"
                      + (f" (most in {substage})" if substage and substage != chosen else "")
                      + f" -> {fix}: {advice}" + _chain_text(chain))
    return out


TAIL_FACTOR = 5.0  # a request this many times the baseline's median TTFT is in the tail
TAIL_EXPLAINED_SHARE = 0.5  # a sub-stage explains a tail request when it holds this much of
# its excess over the baseline's median


def tails(rows: list[dict], base_rows: list[dict], ttft_noise: float) -> dict | None:
    """The requests a median leaves out: those ``TAIL_FACTOR`` times the baseline's median TTFT
    (and beyond the noise), with the sub-stage that holds most of their excess where one
    sub-stage holds at least ``TAIL_EXPLAINED_SHARE`` of it for each of them (then its fix), else
    said as unexplained by anything measured."""
    base_p50 = median([r["client_ttft_s"] for r in base_rows])
    bar = base_p50 + max(ttft_noise, (TAIL_FACTOR - 1.0) * base_p50)
    slow = [r for r in rows if r["client_ttft_s"] > bar]
    if not slow or len(slow) * 2 > len(rows):  # half or more slow: that is the median's matter
        return None
    ordered = sorted(rows, key=lambda r: r.get("activation_index") or 0)
    first = all("activation_index" in r for r in rows) and ordered[:len(slow)] == sorted(
        slow, key=lambda r: r["activation_index"])
    slow = ordered[:len(slow)] if first else sorted(slow, key=lambda r: -r["client_ttft_s"])
    base_sub = {k: _mean([r["substages"].get(k, 0.0) for r in base_rows])
                for r in (*rows, *base_rows) for k in r["substages"]}

    def cause(r: dict) -> str | None:
        excess = r["client_ttft_s"] - base_p50
        own = {k: v - base_sub.get(k, 0.0) for k, v in r["substages"].items()
               if semconv.stage_family(k) != k}  # a sub-stage, not a family's remainder
        key = max(sorted(own), key=lambda k: own[k], default=None)
        return key if key is not None and own[key] >= TAIL_EXPLAINED_SHARE * excess else None

    causes = {cause(r) for r in slow}
    model = next((r.get("model") for r in slow if r.get("model")), None)
    who = (f"the {'first' if first else 'slowest'} {len(slow)} of {len(rows)} requests"
           + (f" to {model}" if model else ""))
    out = {"requests": len(slow), "of": len(rows), "first": first,
           "client_ttft_s": [round(r["client_ttft_s"], 6) for r in slow], "substage": None,
           "recommendation": NONE}
    if len(causes) != 1 or None in causes:
        out["summary"] = (f"{who} took {_list(r['client_ttft_s'] for r in slow)}, "
                          f"{TAIL_FACTOR:g}x or more the baseline's {_s(base_p50)}; no measured "
                          f"stage explains it: nothing to change")
        return out
    (sub,) = causes
    fix, advice = fix_for(sub, semconv.stage_family(sub))
    out.update(substage=sub, recommendation=fix,
               substage_s=[round(r["substages"][sub], 6) for r in slow],
               summary=(f"{who} spent {_list(r['substages'][sub] for r in slow)} in {sub} "
                        f"(TTFT {_list(r['client_ttft_s'] for r in slow)} against "
                        f"{_s(base_p50)}) -> {fix}: {advice}"))
    return out


def _list(seconds: Iterable[float]) -> str:
    values = [_s(v) for v in seconds]
    return ", ".join(values[:-1]) + " and " + values[-1] if len(values) > 1 else values[0]


def _walk(deltas: dict[str, tuple[float, float]], increase: float, evidence: dict, *,
          largest: bool = True) -> tuple[str | None, list[str]]:
    """The article's walk: the earliest stage of the causal chain that expanded materially;
    a side stage (front end, network) only when it grew more. None expanded: the one that grew
    most when ``largest``, else ``None``."""
    skipped = []
    material = [s for s in PIPELINE
                if deltas[s][0] > deltas[s][1] and deltas[s][0] >= MATERIAL_SHARE * increase]
    if semconv.STAGE_LOAD in material and ev.load_unchanged(evidence):
        material.remove(semconv.STAGE_LOAD)
        skipped.append("load grew but bytes read and resident state did not change: not "
                       "blamed on loading")
    causal = [s for s in material if s not in SIDE_STAGES]
    side = [s for s in material if s in SIDE_STAGES]
    chosen = causal[0] if causal else None
    largest_side = max(side, key=lambda s: deltas[s][0], default=None)
    if largest_side and (chosen is None or deltas[largest_side][0] > deltas[chosen][0]):
        chosen = largest_side
    elif largest_side:
        skipped.append(f"{largest_side} also grew (+{deltas[largest_side][0]:.3f} s), less "
                       f"than {chosen}")
    if chosen is None and not largest:
        return None, skipped
    if chosen is None:  # spread thin over several stages: name the one that grew most
        chosen = max(PIPELINE, key=lambda s: deltas[s][0])
        skipped.append("no single stage grew by 10 % of the increase; naming the largest")
    return chosen, skipped


def _chain(deltas: dict[str, tuple[float, float]], increase: float, rows: list[dict],
           base_rows: list[dict], *, least: float | None = None) -> list[dict]:
    """Every stage that grew by at least ``MATERIAL_SHARE`` of the increase (of ``least`` when
    given: the smaller of the medians' and the middle half's, so neither measure hides a stage),
    in pipeline order (the earliest first), with its delta, share of the increase the deltas
    add up to, noise and own fix."""
    least = increase if least is None else least
    out = []
    for stage in PIPELINE:
        delta, stage_noise = deltas[stage]
        if increase <= 0 or least <= 0 or delta < MATERIAL_SHARE * least:
            continue
        substage = _largest_substage(stage, rows, base_rows)
        fix, _ = fix_for(substage, stage)
        out.append({"stage": stage, "substage": substage, "delta_s": round(delta, 6),
                    "share": round(delta / increase, 4), "noise_s": round(stage_noise, 6),
                    "beyond_noise": delta > stage_noise, "recommendation": fix})
    return out


def _thin_noise(stage: str, rows: list[dict], base_rows: list[dict],
                thin: AlertThresholds) -> float:
    """The alert thresholds for a family, applied where the alert applies them: to the part of
    it that grew most (a sub-stage, or the family's own time outside its sub-stages), so a
    compile that took four times as long is not hidden by the rest of the warm-up."""
    def parts(r: dict) -> dict[str, float]:
        subs = {k: v for k, v in r["substages"].items() if semconv.stage_family(k) == stage}
        return {**subs, stage: r["stages"][stage] - sum(subs.values())}

    now = [parts(r) for r in rows]
    then = [parts(r) for r in base_rows]
    keys = {k for p in (*now, *then) for k in p}
    grown = max(sorted(keys), key=lambda k: _mean([p.get(k, 0.0) for p in now])
                - _mean([p.get(k, 0.0) for p in then]))
    return thin.stage_noise(median([p.get(grown, 0.0) for p in then]))


def _chain_text(chain: list[dict]) -> str:
    if not chain:
        return ""
    parts = []
    for link in chain:
        sub = link["substage"]
        where = f", most in {sub}" if sub and sub != link["stage"] else ""
        quiet = ", within its noise" if not link["beyond_noise"] else ""
        parts.append(f"{link['stage']} +{_s(link['delta_s'])} ({link['share']:.0%}{where}"
                     f"{quiet}: {link['recommendation']})")
    return "; what grew, in pipeline order: " + ", ".join(parts)


def _grew(key: str, rows: list[dict], base_rows: list[dict]) -> float:
    return (_mean([r["substages"].get(key, 0.0) for r in rows])
            - _mean([r["substages"].get(key, 0.0) for r in base_rows]))


def _largest_substage(stage: str, rows: list[dict], base_rows: list[dict]) -> str | None:
    keys = {k for r in (*rows, *base_rows) for k in r["substages"]
            if semconv.stage_family(k) == stage}
    if not keys:
        return None
    uncached = semconv.STAGE_PREFILL_UNCACHED_PREFIX
    if uncached in keys and _grew(uncached, rows, base_rows) > 0 \
            and ev.cached_share_fell(rows, base_rows):
        return uncached  # prompts no longer, the cache colder: not the context's length
    return max(sorted(keys), key=lambda key: _grew(key, rows, base_rows))


def core(rows: list[dict]) -> list[dict]:
    """The requests around the median: the middle half by client TTFT (rank k kept when
    n/4 <= k + 1/2 <= 3n/4: one of 3, two of 4, three of 5, six of 10; all of 1 or 2). Their
    mean is robust like the median (a request that compiled among warm ones is left out), and
    their stages add up to their TTFT."""
    ranked = sorted(rows, key=lambda r: r["client_ttft_s"])
    n = len(ranked)
    return [r for k, r in enumerate(ranked) if n / 4 <= k + 0.5 <= 3 * n / 4]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def seconds_text(seconds: float) -> str:
    """Seconds as the summary line reads them: 23.2 s, 1.23 s, 14 ms, 4.1 ms."""
    a = abs(seconds)
    if a >= 10:
        return f"{seconds:.1f} s"
    if a >= 1:
        return f"{seconds:.2f} s"
    if a >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.1f} ms"


_s = seconds_text


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + _s(abs(seconds))
