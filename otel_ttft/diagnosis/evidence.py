"""What a verdict shows beside its stage: the facts that tell a cold read from a warm one, a
resident model from a restarted one, and a warm scenario from one that was not.

Every value is measured (by the runtime in vLLM, or by the replay around it); a check that did not
run leaves its key out rather than guessing. The notes say in words what a check found wrong.
"""

from __future__ import annotations

import statistics

from otel_ttft import semconv

__all__ = ["correlation_note", "evidence", "load_unchanged", "prefix_cache_fell",
           "state_notes"]


def _median(values: list) -> float:
    return statistics.median(values) if values else 0.0


def _values(rows: list[dict], key: str) -> list:
    return [r["evidence"][key] for r in rows if r["evidence"].get(key) is not None]


def _share(rows: list[dict], key: str) -> float | None:
    known = _values(rows, key)
    return round(sum(bool(v) for v in known) / len(known), 4) if known else None


def _gb_per_s(rows: list[dict]) -> float | None:
    """Checkpoint read throughput: bytes read over the time spent in shard reads."""
    rates = [r["evidence"]["bytes_read"] / r["substages"][semconv.STAGE_LOAD_READ] / 1e9
             for r in rows if r["evidence"].get("bytes_read")
             and r["substages"].get(semconv.STAGE_LOAD_READ, 0) > 0]
    return round(_median(rates), 4) if rates else None


def evidence(rows: list[dict], base_rows: list[dict]) -> dict:
    """The facts of one scenario against its baseline (medians and shares of its requests)."""
    hits = _values(rows, "compile_cache_hit")
    ratios = _values(rows, "page_cache_resident_ratio")
    out = {
        "n": len(rows), "baseline_n": len(base_rows),
        "bytes_read_p50": _median(_values(rows, "bytes_read")),
        "baseline_bytes_read_p50": _median(_values(base_rows, "bytes_read")),
        "read_gb_per_s_p50": _gb_per_s(rows),
        "page_cache_resident_ratio_p50": round(_median(ratios), 4) if ratios else None,
        "compile_cache_hit": (all(hits) if hits else None),
        "model_was_resident_share": _share(rows, "model_was_resident") or 0.0,
        "baseline_model_was_resident_share": _share(base_rows, "model_was_resident") or 0.0,
        "prompt_tokens_p50": _median([r["prompt_tokens"] for r in rows
                                      if r["prompt_tokens"] is not None]),
        "baseline_prompt_tokens_p50": _median([r["prompt_tokens"] for r in base_rows
                                               if r["prompt_tokens"] is not None]),
    }
    out.update(_prefix_cache(rows, base_rows))
    before = _values(rows, "evicted_resident_ratio")
    if before:  # the replay evicted the checkpoint and measured it right before the switch
        out["checkpoint_resident_before_start"] = round(max(before), 4)
        read_ok = not ratios or max(ratios) <= semconv.COLD_RESIDENT_MAX
        out["cold"] = bool(all(_values(rows, "evicted_cold")) and read_ok)
    for name, group in (("among_first_requests_share", rows),
                        ("baseline_among_first_requests_share", base_rows)):
        share = _share(group, "among_first_requests")  # its server's first after an activation
        if share is not None:
            out[name] = share
    return out


def _cached_share(rows: list[dict]) -> float | None:
    shares = [r["evidence"]["cached_tokens"] / r["prompt_tokens"] for r in rows
              if r["evidence"].get("cached_tokens") is not None and r.get("prompt_tokens")]
    return round(_median(shares), 4) if shares else None


def _prefix_cache(rows: list[dict], base_rows: list[dict]) -> dict:
    """Prompt tokens read from vLLM's prefix cache, and those the baseline found cached for the
    same prompt but these requests computed (``prefix.split``); only where measured."""
    out = {}
    for name, group in (("", rows), ("baseline_", base_rows)):
        cached = _values(group, "cached_tokens")
        if cached:
            out[f"{name}cached_tokens_p50"] = _median(cached)
            out[f"{name}cached_share_p50"] = _cached_share(group)
    extra = _values(rows, "uncached_prefix_tokens")
    if extra:
        out["uncached_prefix_tokens_p50"] = _median(extra)
    return out


def prefix_cache_fell(evidence: dict) -> bool:
    """The cached share fell against the baseline's for the same prompt."""
    return (evidence.get("uncached_prefix_tokens_p50") or 0) > 0


def state_notes(evidence: dict) -> list[str]:
    """What the checks found wrong with the state a scenario was meant to start from."""
    notes = []
    if evidence.get("cold") is False:
        before = evidence.get("checkpoint_resident_before_start", 0.0)
        at_read = evidence.get("page_cache_resident_ratio_p50")
        if before > semconv.COLD_RESIDENT_MAX:
            notes.append(f"not cold: the checkpoint stayed {before:.0%} in the page cache after "
                         "eviction (retried once); its reads were served from memory")
        else:
            notes.append(f"not cold: the checkpoint was {before:.0%} in the page cache right "
                         f"before the switch but {at_read or 0:.0%} when its shards were read: "
                         "something else read the files in between")
    early = evidence.get("among_first_requests_share")
    if evidence.get("model_was_resident_share") == 1.0 and early:
        notes.append(f"not warm: {early:.0%} of its requests were among their server's first "
                     "after an activation (OTEL_TTFT_COLD_REQUESTS)")
    if evidence.get("baseline_among_first_requests_share"):
        notes.append(f"baseline not warm: {evidence['baseline_among_first_requests_share']:.0%} "
                     "of its requests were among their server's first after an activation")
    return notes


def load_unchanged(evidence: dict) -> bool:
    return (evidence["bytes_read_p50"] == evidence["baseline_bytes_read_p50"]
            and evidence["model_was_resident_share"]
            == evidence["baseline_model_was_resident_share"])


def correlation_note(stage: str, rows: list[dict], base_rows: list[dict], evidence: dict
                     ) -> list[str]:
    """The article's failure boundary: a warm, resident model whose TTFT tracks prompt length
    or concurrency; any switch there is only correlated. Only what was measured to grow with
    TTFT is named; when nothing did, the note says so."""
    if stage not in (semconv.STAGE_PREFILL, semconv.STAGE_QUEUE):
        return []
    if stage == semconv.STAGE_PREFILL and prefix_cache_fell(evidence):
        return [f"the prefix cache was colder than the baseline's: "
                f"{evidence['uncached_prefix_tokens_p50']:g} prompt tokens the baseline read "
                f"from it (cached share {evidence.get('baseline_cached_share_p50') or 0:.0%}) "
                f"were computed here ({evidence.get('cached_share_p50') or 0:.0%} cached)"]
    if evidence["model_was_resident_share"] < 1.0:
        return []
    tokens, base_tokens = evidence["prompt_tokens_p50"], evidence["baseline_prompt_tokens_p50"]
    waiting = _median([r["waiting_at_arrival"] for r in rows
                       if r.get("waiting_at_arrival") is not None])
    base_waiting = _median([r["waiting_at_arrival"] for r in base_rows
                            if r.get("waiting_at_arrival") is not None])
    evidence["waiting_at_arrival_p50"] = waiting
    evidence["baseline_waiting_at_arrival_p50"] = base_waiting
    tracks = []
    if tokens > base_tokens:
        tracks.append(f"prompt tokens ({base_tokens:g} -> {tokens:g})")
    if waiting > base_waiting:
        tracks.append(f"requests waiting at arrival ({base_waiting:g} -> {waiting:g})")
    if not tracks:
        return [f"the model was resident and warm, and neither prompt tokens ({tokens:g}) nor "
                f"requests waiting at arrival ({waiting:g}) grew: nothing measured tracks TTFT"]
    return [f"the model was resident and warm: TTFT tracks {' and '.join(tracks)}; a model "
            f"switch here is only correlated, {stage} is the direct cause"]


CACHE_SHARE_DROP = 0.10  # of the prompt: a fall in the cached share worth naming
PROMPT_GROWTH = 1.10  # prompts this much longer than the baseline's are a longer context


def cached_share_fell(rows: list[dict], base_rows: list[dict]) -> bool:
    """Whether these requests read a smaller share of their prompt tokens from vLLM's prefix
    cache than the baseline's (all their prompt tokens together, as vLLM's own hit rate counts
    them; by ``CACHE_SHARE_DROP``) with prompts no longer on average (``PROMPT_GROWTH``): their
    extra prefill is the cache's, not the context's."""
    def share(rs: list[dict]) -> tuple[float, float] | None:
        prompt = cached = n = 0
        for r in rs:
            t, c = r.get("prompt_tokens"), (r.get("evidence") or {}).get("cached_tokens")
            if isinstance(t, int) and t > 0 and isinstance(c, int) and c >= 0:
                prompt, cached, n = prompt + t, cached + min(c, t), n + 1
        return (cached / prompt, prompt / n) if n else None
    now, base = share(rows), share(base_rows)
    if now is None or base is None:
        return False
    return now[0] <= base[0] - CACHE_SHARE_DROP and now[1] <= PROMPT_GROWTH * base[1]
