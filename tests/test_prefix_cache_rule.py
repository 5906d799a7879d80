"""The prefix cache is part of a cold model (issue 49): prefill of prompt tokens the baseline
read from vLLM's prefix cache for the same prompt is its own sub-stage, and a verdict on it is
warm-up, not context policy; where the cached share did not change, prefill stays tune-context."""

from __future__ import annotations

import json

import pytest

from otel_ttft import semconv
from otel_ttft.diagnosis import prefix
from otel_ttft.tools.analysis import verdict as rule
from otel_ttft.tools.analysis.breakdown import PIPELINE

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX


def req(prefill: float, *, tokens: int = 400, cached: int | None = 384, prompt: str = "short",
        scenario: str = "short-prompt", frontend: float = 0.002) -> dict:
    stages = dict.fromkeys(PIPELINE, 0.0)
    stages.update(frontend=frontend, queue=0.001, prefill=prefill)
    ev = {"bytes_read": 0, "page_cache_resident_ratio": None, "compile_cache_hit": None,
          "model_was_resident": True}
    if cached is not None:
        ev["cached_tokens"] = cached
    return {"scenario": scenario, "prompt": prompt, "prompt_tokens": tokens,
            "client_ttft_s": sum(stages.values()), "stages": stages,
            "substages": {"frontend": frontend, "queue": 0.001, "prefill": prefill},
            "evidence": ev, "waiting_at_arrival": 0,
            "segments": [{"stage": "frontend", "substage": "frontend", "start_s": 0.0,
                          "duration_s": frontend},
                         {"stage": "prefill", "substage": "prefill", "start_s": frontend,
                          "duration_s": prefill}]}


BASE = [req(p) for p in (0.020, 0.021, 0.022, 0.020, 0.021)]  # 384 of 400 tokens cached


def test_the_uncached_prefix_is_the_prefill_share_of_tokens_the_baseline_found_cached():
    cold = req(0.200, cached=0, scenario="switch-back")
    [out] = prefix.split([cold], BASE)
    assert out["evidence"]["uncached_prefix_tokens"] == 384
    assert out["evidence"]["baseline_cached_share"] == pytest.approx(0.96)
    assert out["substages"][UNCACHED] == pytest.approx(0.200 * 384 / 400)
    assert out["substages"]["prefill"] == pytest.approx(0.200 * 16 / 400)
    assert out["stages"]["prefill"] == 0.200  # the family total does not change
    assert [s["substage"] for s in out["segments"]] == ["frontend", UNCACHED, "prefill"]
    assert sum(s["duration_s"] for s in out["segments"]) == pytest.approx(0.202)
    assert "cached_tokens" in cold["evidence"] and UNCACHED not in cold["substages"]  # a copy
    # half the prefix found cached: only the other half is the cold cache's
    [half] = prefix.split([req(0.1, cached=192, scenario="x")], BASE)
    assert half["evidence"]["uncached_prefix_tokens"] == 192
    assert half["substages"][UNCACHED] == pytest.approx(0.1 * 192 / 208, abs=1e-6)


@pytest.mark.parametrize("row", [
    req(0.2, cached=0, prompt="long", tokens=480),  # another prompt: no shared prefix known
    req(0.2, cached=None),  # cached tokens not measured
    req(0.2, cached=384),  # as cached as the baseline
    {**req(0.2, cached=0), "prompt": None},  # live traffic: no prompt to match
])
def test_no_sub_stage_without_a_measured_fall_of_the_same_prompts_cached_share(row):
    [out] = prefix.split([row], BASE)
    assert UNCACHED not in out["substages"]
    assert out["substages"] == row["substages"]


def test_a_cold_prefix_cache_is_named_with_the_warm_up_fix_not_context_policy():
    rows = prefix.split([req(0.200 + 0.002 * i, cached=0, scenario="switch-back")
                         for i in range(3)], BASE)
    v = rule.verdict("switch-back", "short-prompt", rows, BASE)
    assert (v["outcome"], v["stage"], v["substage"], v["recommendation"]) == (
        "expanded", "prefill", UNCACHED, "warm-up")
    assert "most in prefill.uncached_prefix" in v["summary"]
    assert "prefix cache" in v["summary"] and "tune-context" not in v["summary"]
    ev = v["evidence"]
    assert ev["uncached_prefix_tokens_p50"] == 384
    assert (ev["cached_share_p50"], ev["baseline_cached_share_p50"]) == (0.0, 0.96)
    assert "the prefix cache was colder than the baseline's" in ev["note"]
    assert "only correlated" not in ev["note"]
    assert v["chain"][0]["substage"] == UNCACHED and v["chain"][0]["recommendation"] == "warm-up"


def test_prefill_that_grew_with_the_cached_share_unchanged_stays_tune_context():
    rows = prefix.split([req(0.2 + 0.002 * i, scenario="slow") for i in range(3)], BASE)
    v = rule.verdict("slow", "short-prompt", rows, BASE)
    assert (v["stage"], v["substage"], v["recommendation"]) == ("prefill", "prefill",
                                                                "tune-context")
    assert "uncached_prefix_tokens_p50" not in v["evidence"] or \
        v["evidence"]["uncached_prefix_tokens_p50"] == 0


def test_a_long_prompt_without_the_shared_prefix_still_gets_tune_context():
    rows = prefix.split([req(0.9 + 0.01 * i, cached=0, prompt="long", tokens=480,
                             scenario="long-prompt") for i in range(3)], BASE)
    v = rule.verdict("long-prompt", "short-prompt", rows, BASE)
    assert (v["stage"], v["recommendation"]) == ("prefill", "tune-context")
    assert v["substage"] == "prefill"
    assert "TTFT tracks prompt tokens (400 -> 480)" in v["evidence"]["note"]


def test_a_small_cold_prefix_beside_a_larger_prefill_growth_is_not_the_fix():
    """4 tokens colder than the baseline's, while prefill grew 45-fold on the same prompt: the
    rest of prefill grew most, so context policy stays the fix; the note names the colder cache."""
    rows = prefix.split([req(0.9 + 0.01 * i, cached=380, scenario="slow") for i in range(3)],
                        BASE)
    v = rule.verdict("slow", "short-prompt", rows, BASE)
    assert rows[0]["substages"][UNCACHED] > 0
    assert (v["substage"], v["recommendation"]) == ("prefill", "tune-context")
    assert "the prefix cache was colder than the baseline's: 4 prompt tokens" in \
        v["evidence"]["note"]


def test_analyze_reads_the_cached_tokens_from_the_request_span_and_splits_prefill():
    """From spans: the baseline read 384 of 400 prompt tokens from the cache; the scenario's
    requests (same prompt) read none and prefilled ten times as long."""
    from otel_ttft.tools.analysis.analyze import analyze
    from otel_ttft.tools.analysis.breakdown import collect
    from otel_ttft.tools.analysis.contract import parse_analysis
    from tests import analysis_fixtures as fx

    spans = [*fx.run_span()]
    spans += fx.warm_requests("short-prompt", "A", 0.0, n=5, tokens=400, cached=384,
                              prefill=0.020)
    spans += fx.warm_requests("switch-back", "A", 10.0, n=3, tokens=400, cached=0,
                              prefill=0.200)
    by_trace: dict[str, list[dict]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    doc = analyze(collect(by_trace.values()))
    back = [r for r in doc["requests"] if r["scenario"] == "switch-back"]
    base = [r for r in doc["requests"] if r["scenario"] == "short-prompt"]
    assert all(r["evidence"]["cached_tokens"] == 384 for r in base)
    assert all(UNCACHED not in r["substages"] for r in base)  # the baseline is the reference
    for r in back:
        assert r["evidence"]["cached_tokens"] == 0
        assert r["substages"][UNCACHED] == pytest.approx(0.200 * 384 / 400, abs=1e-5)
        assert sum(r["stages"].values()) == pytest.approx(r["client_ttft_s"], abs=1e-5)
        assert sum(s["duration_s"] for s in r["segments"]) == pytest.approx(
            r["client_ttft_s"], abs=1e-5)
    assert doc["scenarios"]["switch-back"]["substages_p50"][UNCACHED] > 0.19
    v = next(v for v in doc["verdicts"] if v["scenario"] == "switch-back")
    assert (v["stage"], v["substage"], v["recommendation"]) == ("prefill", UNCACHED, "warm-up")
    assert v["change"]["candidates"][0]["id"] == "prefix-warm-up"
    parse_analysis(json.dumps(doc))  # still the v1 contract
