"""The concrete fixes of issue 56 on records: the cold prefix cache measured against the warm
requests before a start (the verdict, or a second finding), the compile cache's fate, the slow
read's command with the exact files, and ``analyze``'s live traffic where the cached share fell
(``warm-up``, never ``tune-context``)."""

from __future__ import annotations

import pytest

from otel_ttft import semconv
from otel_ttft.diagnosis import activation as diagnosis
from otel_ttft.diagnosis import compile_fix, rule
from otel_ttft.diagnosis.vocabulary import Vocabulary
from otel_ttft.diagnosis.vocabulary_store import shipped
from tests.test_activation_verdict import record

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX
COLD = semconv.VERDICT_PHASE_COLD_REQUESTS


def _vocab():
    return Vocabulary.from_json(shipped("0.32.0"))


def _cold(i, uncached_s, tokens, prefixes=1, **extra):
    stages = {"frontend": 0.02, "prefill": 0.03}
    if uncached_s:
        stages[UNCACHED] = uncached_s
    return dict(record(i, **extra), cold={
        "requests": 3, "ttft_s": 0.05 + uncached_s, "stages": stages, "prompt_tokens": 3600,
        "cached_tokens": 2300, "uncached_prefix_tokens": tokens, "prefixes": prefixes,
        "warm_requests": 3, "warm_cached_share": 0.95})


def test_a_cold_prefix_cache_against_the_warm_baseline_is_the_verdict():
    """The earlier start's cold requests were just as cold (their own uncached prefix): against
    them nothing grew; against the warm requests before this start, the prefix cache was cold."""
    earlier = [_cold(1, 0.04, 1100)]
    j = diagnosis.judge(_cold(9, 0.04, 1152, prefixes=2), earlier, phase=COLD, vocab=_vocab())
    assert (j["outcome"], j["stage"], j["substage"], j["recommendation"]) == (
        "expanded", "prefill", UNCACHED, "warm-up"), j["summary"]
    assert j["increase_s"] == pytest.approx(0.04) and j["change"] == []
    assert j["evidence"]["cold_uncached_prefix_tokens"] == 1152
    s = j["summary"]
    assert "cold prefix cache" in s and "send the shared 2 prefixes" in s
    assert "POST /v1/chat/completions with max_tokens 1" in s  # the route vLLM declares
    assert "warm requests read 95% of their prompt tokens" in s
    # no earlier start at all: the warm baseline still names it
    j = diagnosis.judge(_cold(9, 0.04, 1152), [], phase=COLD, vocab=_vocab())
    assert (j["substage"], j["recommendation"]) == (UNCACHED, "warm-up"), j["summary"]


def test_nothing_is_claimed_without_a_material_uncached_prefix():
    for rec in (_cold(9, 0.0, 0), _cold(9, 0.001, 50),  # none; under the noise floor
                dict(_cold(9, 0.04, 1152), cold={**_cold(9, 0.04, 1152)["cold"],
                                                 "ttft_s": 5.0})):  # under 10 % of TTFT
        j = diagnosis.judge(rec, [_cold(1, 0.0, 0)], phase=COLD, vocab=_vocab())
        assert j["substage"] != UNCACHED and "prefix" not in j["summary"], j["summary"]
        assert "prefix" not in j


def test_beside_a_start_that_grew_it_is_a_second_finding():
    rec = _cold(9, 0.04, 1152, warmup__profile=40.0)
    j = diagnosis.judge(rec, [_cold(1, 0.0, 0)], phase=COLD, vocab=_vocab())
    assert j["substage"] == semconv.STAGE_WARMUP_PROFILE
    assert "; also a cold prefix cache (prefill.uncached_prefix +40 ms" in j["summary"]


def _cache(state, **extra):
    return {"root": "/srv/vllm", "state": state, "keys_with_artifacts": 1,
            "other_keys": ["abc"], "other_newest_mtime": 0, "other_factors": {},
            "disabled": False, "kept": True, "kept_why": "", "in_container": False,
            "truncated": False, **extra}


def test_a_compile_miss_says_what_happened_to_the_cache():
    vocab = _vocab()
    what, fix = compile_fix.explain(_cache("empty"), vocab, earlier_start=True)
    assert "was empty when this start began although an earlier start" in what
    assert fix.startswith("keep VLLM_CACHE_ROOT=/srv/vllm on durable storage")
    what, fix = compile_fix.explain(_cache("other-keys", other_factors={"config_hash": "c1"}),
                                    vocab)
    assert "1 other key (vLLM's config hash c1)" in what and "version" in what
    assert "before rollout" in fix
    lost = _cache("missing", kept=False, kept_why="on the container's own file system (overlay)")
    assert "docker run -v vllm-cache:/srv/vllm" in compile_fix.explain(lost, vocab)[1]
    assert "VLLM_LOGGING_LEVEL=DEBUG" in compile_fix.explain(_cache("present"), vocab)[1]
    assert compile_fix.explain(_cache("empty", disabled=True), vocab)[1] == \
        "unset VLLM_DISABLE_COMPILE_CACHE"
    assert "the measurement that decides" in compile_fix.explain(_cache("unknown"), vocab)[1]
    assert compile_fix.explain(None, vocab) is None


def test_a_start_after_one_that_compiled_finds_the_cache_empty():
    rec = record(9, hit=False)
    rec["facts"]["compile_cache"] = _cache("empty")
    j = diagnosis.judge(rec, [record(1, hit=False)], vocab=_vocab())
    assert "the compile missed: the compile cache under /srv/vllm was empty" in j["summary"]
    assert "compile_cache" not in diagnosis.judge(rec, [], vocab=_vocab())  # a first start
    hit = record(9, hit=True)
    hit["facts"]["compile_cache"] = _cache("empty")
    assert "compile_cache" not in diagnosis.judge(hit, [record(1)], vocab=_vocab())
    # the verdict is the compile: its change says it, with vLLM's cache root
    slow = record(9, hit=False, warmup__compile=40.0)
    slow["facts"]["compile_cache"] = _cache("empty")
    j = diagnosis.judge(slow, [record(1)], vocab=_vocab())
    assert j["substage"] == semconv.STAGE_WARMUP_COMPILE
    assert j["change"] == ["VLLM_CACHE_ROOT=/srv/vllm"] and "was empty" in j["summary"]


def test_a_cold_slow_read_names_the_page_cache_command_with_the_files_and_vllms_options():
    files = ["/models/m/model-00001.safetensors", "/models/m/model 2.safetensors"]
    slow = record(9, load__read=30.0)
    slow["evidence"].update(bytes_read=4 * 2**30, page_cache_resident_ratio=0.0)
    slow["facts"]["shard_paths"] = files
    base = record(1)
    base["evidence"].update(bytes_read=0, page_cache_resident_ratio=1.0)
    j = diagnosis.judge(slow, [base], vocab=_vocab())
    assert (j["substage"], j["recommendation"]) == (semconv.STAGE_LOAD_READ, "keep-resident")
    s = j["summary"]
    assert "vmtouch -t /models/m/model-00001.safetensors '/models/m/model 2.safetensors'" in s
    assert "0% in the page cache before its read" in s and "4.00 GiB came from storage at " \
        "0.14 GB/s in 31.0 s" in s  # load.read 1 s + 30 s
    assert "or --safetensors-load-strategy prefetch" in s  # the installed vLLM's choice
    assert "--load-format runai_streamer" in s or "--load-format fastsafetensors" in s


def _live(cached, prefill, tokens=1218, uncached=0.0):
    subs = {"prefill": prefill}
    if uncached:
        subs[UNCACHED] = uncached
    return {"client_ttft_s": 0.01 + prefill + uncached, "prompt_tokens": tokens,
            "prompt": "live traffic", "model": "m", "waiting_at_arrival": 0,
            "stages": {**dict.fromkeys(rule.PIPELINE, 0.0), "frontend": 0.01,
                       "prefill": prefill + uncached},
            "substages": subs, "evidence": {"cached_tokens": cached, "bytes_read": 0,
                                            "model_was_resident": True}}


def test_where_the_cached_share_fell_prefill_is_the_cold_cache_never_context():
    base = [_live(1152, 0.01 + 0.001 * i) for i in range(6)]
    first = [_live(0, 0.012, uncached=0.03 + 0.001 * i) for i in range(3)] + [
        _live(1152, 0.011)]
    v = rule.verdict("m:first", "m:warm", first, base)
    assert (v["stage"], v["substage"], v["recommendation"]) == ("prefill", UNCACHED, "warm-up")
    assert all(c["recommendation"] != "tune-context" for c in v["chain"]), v["chain"]
    # longer prompts with the cache as warm: the context's length
    longer = [_live(1152, 0.06 + 0.001 * i, tokens=2000) for i in range(4)]
    assert rule.verdict("m:first", "m:warm", longer, base)["recommendation"] == "tune-context"
