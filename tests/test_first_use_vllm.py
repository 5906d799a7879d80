"""A compile on first use, provoked on purpose and fixed by ``verify`` (issue 46), on real vLLM
(CPU build, tiny models) through the real replay, analyze and verify.

One replay with ``--logprobs 2`` and ``--switch-ahead``: every request asks for logprobs but the
probes that answer an activation's cold requests (a readiness check's bare requests). In
switch-back, A is activated ahead of its user and warmed by probes only, so the user's request
is the first to ask for logprobs: vLLM compiles its rank counting inside that request's step.
short-prompt, the baseline, runs on a server warmed with requests as users send them. The
verdict names ``warmup.step_compile`` with the ``first-use-warm-up`` change, and ``verify`` re-runs
switch-back with one request as users send it after the activation: the compile moves out of the
user's request. Both in ``make acceptance`` (four server starts); ``test_step_compile_vllm``
covers the runtime in ``make test``. Asserts are on what was measured, never on seconds.
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

pytestmark = [pytest.mark.vllm, pytest.mark.acceptance]

STEP_COMPILE = semconv.STAGE_WARMUP_STEP_COMPILE
EAGER = DEFAULT_TEMPLATE + " " + " ".join(EAGER_ARGS)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    tmp = tmp_path_factory.mktemp("first-use")
    yield tmp, replay_and_analyze(tmp, [
        "--scenarios", "switch-back,short-prompt", "--switch-ahead", "--logprobs", "2",
        "--repeat-warm", "4", "--max-tokens", "4", "--serve-a", EAGER, "--serve-b", EAGER])


def test_the_first_request_asking_for_logprobs_pays_a_compile_named_with_its_fix(replayed):
    _, doc = replayed
    assert doc["run"]["sampling"]["logprobs"] == 2
    for r in rows(doc, "short-prompt"):  # warmed as users send: compiled before it was timed
        assert STEP_COMPILE not in r["substages"], r
    (back,) = rows(doc, "switch-back")
    assert back["substages"][STEP_COMPILE] > 0, back
    v = verdict(doc, "switch-back")
    assert (v["stage"], v["substage"], v["recommendation"]) == (
        semconv.STAGE_WARMUP, STEP_COMPILE, "warm-up"), v["summary"]
    first = v["change"]["candidates"][0]
    assert (first["id"], first["prepare"], first["missing"]) == (
        "first-use-warm-up", "warm-prefix", []), first
    assert "2 logprobs per token" in first["reason"]


def test_verify_warms_up_as_users_send_and_the_compile_leaves_the_users_request(replayed):
    tmp, _ = replayed
    out = tmp / "verify"
    rc = cli.main(["verify", str(tmp / "analysis.json"), "--out", str(out), "--scenario",
                   "switch-back", "--candidate", "first-use-warm-up"])
    assert rc == 0
    (r,) = json.loads((out / "analysis.json").read_text())["verifications"]
    assert r["stage"] == STEP_COMPILE and r["stage_before_s"] > 0, r
    assert r["stage_after_s"] == 0, r
    assert r["new_verdict"]["substage"] != STEP_COMPILE, r
