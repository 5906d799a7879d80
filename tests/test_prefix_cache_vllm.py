"""The prefix cache is part of a cold model (issue 49), on real vLLM (CPU build, tiny models),
with vLLM's default prefix caching on, through the real replay, analyze and verify.

One replay, two server starts: switch-back with ``--switch-ahead`` (B alone, then A activated
before its user arrives, its cold requests answered by probes that share nothing with the chat
turn), then short-prompt (the baseline: A warm, its chat turns read the shared prefix from the
cache) and long-prompt (a numbered long prompt that shares no prefix) on the same A. A 2,048-token
context makes the chat turn's shared prefix about 1,200 tokens: nine of vLLM-CPU's 128-token
blocks, far more prefill than the question after it.

The analysis (``vllm``, in ``make test``): the baseline read most of its prompt from the cache,
switch-back none of it, and its prefill of those tokens is ``prefill.uncached_prefix``, named by
the verdict with the warm-up; the long prompt read nothing, no sub-stage, ``tune-context``.
``verify`` with the prefix warm-up (``acceptance``: two more starts) re-runs switch-back with one
chat turn sent after A's activation, before the user's: the user's then reads the prefix from
the cache and the sub-stage is gone. Asserts are on what was measured (cached tokens, sub-stages,
verdict fields), never on seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools import cli
from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE
from tests.replayed import replay_and_analyze, rows, verdict
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX
EAGER = DEFAULT_TEMPLATE + " " + " ".join(EAGER_ARGS)
A_2048 = EAGER + " --max-model-len 2048"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    """The replay and its analysis, shared by the tests below (two server starts)."""
    tmp = tmp_path_factory.mktemp("prefix-cache")
    yield tmp, replay_and_analyze(tmp, [
        "--scenarios", "switch-back,short-prompt,long-prompt", "--switch-ahead",
        "--repeat-warm", "4", "--max-tokens", "4", "--max-model-len", "2048",
        "--serve-a", A_2048, "--serve-b", EAGER])


def test_a_switch_that_emptied_the_prefix_cache_is_named_with_the_warm_up(replayed):
    _, doc = replayed
    assert doc["run"]["setup"]["switch_ahead"] is True
    prompts = doc["run"]["prompts"]
    assert prompts["short"]["shared_prefix_tokens"] > 1000 and \
        prompts["long"]["shared_prefix_tokens"] == 0
    base = rows(doc, "short-prompt")
    # warm: every chat turn read its shared prefix from vLLM's prefix cache (whole blocks of it)
    for r in base:
        assert r["evidence"]["cached_tokens"] >= 1024 and UNCACHED not in r["substages"], r
    (back,) = rows(doc, "switch-back")
    # activated ahead, probes only: the process warm, the prefix cache cold
    assert back["evidence"]["cached_tokens"] == 0, back["evidence"]
    assert not back["evidence"].get("among_first_requests"), back["evidence"]
    assert back["evidence"]["uncached_prefix_tokens"] >= 1024
    assert back["substages"][UNCACHED] > back["substages"].get(semconv.STAGE_PREFILL, 0.0)
    v = verdict(doc, "switch-back")
    assert (v["stage"], v["substage"], v["recommendation"]) == ("prefill", UNCACHED,
                                                                "warm-up"), v
    assert "the prefix cache was colder than the baseline's" in v["evidence"]["note"]
    first = v["change"]["candidates"][0]
    assert (first["id"], first["prepare"], first["missing"]) == (
        "prefix-warm-up", "warm-prefix", []), first
    assert "POST /v1/chat/completions" in first["reason"]  # the route vLLM's router declares


def test_a_long_prompt_with_no_shared_prefix_still_gets_tune_context(replayed):
    _, doc = replayed
    for r in rows(doc, "long-prompt"):
        assert r["evidence"]["cached_tokens"] < 128, r["evidence"]  # not one whole block
        assert UNCACHED not in r["substages"]
    v = verdict(doc, "long-prompt")
    assert (v["stage"], v["substage"], v["recommendation"]) == ("prefill", "prefill",
                                                                "tune-context"), v
    assert "prefix-caching" not in [c["id"] for c in v["change"]["candidates"]]


@pytest.mark.acceptance
def test_verify_sends_the_shared_prefix_after_activation_and_the_sub_stage_goes(replayed):
    tmp, _ = replayed
    out = tmp / "verify"
    rc = cli.main(["verify", str(tmp / "analysis.json"), "--out", str(out), "--scenario",
                   "switch-back", "--candidate", "prefix-warm-up"])
    assert rc == 0
    result = json.loads((out / "analysis.json").read_text())
    (r,) = result["verifications"]
    assert r["status"] in ("verified", "not-verified") and r["stage"] == UNCACHED, r
    assert r["stage_before_s"] > 0 and r["stage_after_s"] == 0, r
    assert r["new_verdict"]["substage"] != UNCACHED, r
    # the re-run's user request read the shared prefix the warm-up left in the cache
    again = out / "again.json"
    assert cli.main(["analyze", str(out / "store"), "--json", str(again)]) == 0
    (user,) = rows(json.loads(again.read_text()), "switch-back")
    assert user["evidence"]["cached_tokens"] >= 1024, user["evidence"]
