"""``otel-ttft replay`` end to end on real vLLM (CPU build, the two tiny models), restart driver:
cold-switch, switch-back and short-prompt (three server starts), spans into a real receiver, then
``otel-ttft analyze`` on them. B's checkpoint sits on "slow storage": a test plugin (on B's
PYTHONPATH only) sleeps in every shard read, so the verdict for the cold switch must be load.

The servers run from user-given templates (``--serve-a/-b``) with ``--enforce-eager``: the test is
about the spans arriving and lining up; a cold torch.compile would only add a minute per start."""

from __future__ import annotations

import json
import shlex

import pytest

from otel_ttft import semconv
from otel_ttft.tools import cli, tiny_model
from otel_ttft.tools.replay.command import run_argv
from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

SCENARIOS = ("cold-switch", "switch-back", "short-prompt")
WARM_REPEATS = 3  # the baseline measures its noise from 3 requests (fewer: "cannot tell")
EAGER = DEFAULT_TEMPLATE + " " + " ".join(EAGER_ARGS)


SLOW_READ_S = 4.0  # per shard of B (6 shards): slow storage, as a NAS would be
SLOW_PLUGIN = """
import os, time


def register():
    from vllm.model_executor.model_loader import weight_utils

    if getattr(weight_utils, "_ttft_test_slow", False):
        return
    weight_utils._ttft_test_slow = True
    inner_open, delay = weight_utils.safe_open, float(os.environ["TTFT_TEST_SLOW_READ_S"])

    class Slow:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            self._f.__enter__()
            time.sleep(delay)  # inside the shard's read: the bytes take this long to arrive
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self._f, name)

    weight_utils.safe_open = lambda *a, **k: Slow(inner_open(*a, **k))
"""


def _named(spans, name):
    return [s for s in spans if s["name"] == name]


@pytest.mark.acceptance
def test_replay_restart_driver_traces_the_switch_end_to_end(receiver, tmp_path, vllm_plugin):
    # B's checkpoint sits on "slow storage": a plugin slows every shard read.
    slow_b = (f"env PYTHONPATH={shlex.quote(vllm_plugin('ttft_test_slow', SLOW_PLUGIN))} "
              f"TTFT_TEST_SLOW_READ_S={SLOW_READ_S} " + EAGER)
    rc = run_argv(["--scenarios", ",".join(SCENARIOS), "--otlp-endpoint", receiver.http_endpoint,
                   "--out", str(tmp_path / "logs"), "--max-tokens", "4", "--repeat-warm",
                   str(WARM_REPEATS), "--serve-a", EAGER, "--serve-b", slow_b])
    assert rc == 0, f"replay failed; server logs in {tmp_path / 'logs'}"
    name_a, name_b = tiny_model.MODEL_NAME, tiny_model.MODEL_B_NAME

    def complete(spans):
        requests = _named(spans, semconv.SPAN_REPLAY_REQUEST)
        children = {s["parent_span_id"] for s in _named(spans, semconv.SPAN_REQUEST)}
        # The last server (A) is stopped at the end: three switch spans in all.
        return (len(requests) == 2 + WARM_REPEATS
                and all(r["span_id"] in children for r in requests)
                and len(_named(spans, semconv.SPAN_SWITCH)) == 3
                and _named(spans, semconv.SPAN_REPLAY_RUN))

    spans = receiver.wait_for_spans(complete, timeout=60)

    (run,) = _named(spans, semconv.SPAN_REPLAY_RUN)
    attrs = run["attributes"]
    assert run["resource"]["service.name"] == semconv.REPLAY_SERVICE_NAME
    assert attrs[semconv.ATTR_REPLAY_DRIVER] == "restart"
    assert attrs[semconv.ATTR_REPLAY_SCENARIOS] == list(SCENARIOS)
    assert attrs[semconv.ATTR_REPLAY_MODELS][:2] == [name_a, name_b]
    assert json.loads(attrs[semconv.ATTR_REPLAY_SAMPLING]) == {
        "temperature": 0.0, "max_tokens": 4, "seed": 1234}
    prompts = json.loads(attrs[semconv.ATTR_REPLAY_PROMPTS])
    assert prompts["long"]["tokens"] > prompts["short"]["tokens"] > 0
    assert attrs[semconv.ATTR_REPLAY_CONCURRENCY] == 1 and attrs[semconv.ATTR_REPLAY_REPEAT] == 1
    assert attrs[semconv.ATTR_REPLAY_REPEAT_WARM] == WARM_REPEATS

    requests = {r["attributes"][semconv.ATTR_REPLAY_SCENARIO]: r
                for r in _named(spans, semconv.SPAN_REPLAY_REQUEST)}
    assert set(requests) == set(SCENARIOS)
    llm = {s["parent_span_id"]: s for s in _named(spans, semconv.SPAN_REQUEST)}
    for scenario, request in requests.items():
        a = request["attributes"]
        assert request["parent_span_id"] in (None, "") and request["kind"] == "CLIENT"
        assert a[semconv.ATTR_REPLAY_RUN_ID] == attrs[semconv.ATTR_REPLAY_RUN_ID]
        child = llm[request["span_id"]]
        assert child["trace_id"] == request["trace_id"]  # traceparent made it across
        assert request["start_ns"] <= a[semconv.ATTR_CLIENT_REQUEST_SENT_NS] <= child["start_ns"]
        ttft_ns = a[semconv.ATTR_CLIENT_TTFT] * 1e9
        assert a[semconv.ATTR_CLIENT_REQUEST_SENT_NS] - request["start_ns"] < ttft_ns
        if a[semconv.GEN_AI_REQUEST_MODEL] == name_a:  # the prompts are sized with A's tokenizer
            # at most that many: each request's own number tokenizes in a few tokens less or more
            assert prompts["short"]["tokens"] - 8 <= a[semconv.GEN_AI_USAGE_INPUT_TOKENS] <= \
                prompts["short"]["tokens"], scenario
        else:  # B has a tokenizer of its own
            assert 0 < a[semconv.GEN_AI_USAGE_INPUT_TOKENS] != prompts["short"]["tokens"]
        assert semconv.ATTR_REPLAY_ERROR not in a

    cold, back = requests["cold-switch"], requests["switch-back"]
    assert cold["attributes"][semconv.GEN_AI_REQUEST_MODEL] == name_b
    assert cold["attributes"][semconv.ATTR_REPLAY_SWITCH_FROM] == name_a
    assert back["attributes"][semconv.ATTR_REPLAY_SWITCH_FROM] == name_b
    # A switch is inside the request: TTFT counts it, the warm request has none.
    warm_ttft = requests["short-prompt"]["attributes"][semconv.ATTR_CLIENT_TTFT]
    assert cold["attributes"][semconv.ATTR_CLIENT_TTFT] > 10 * warm_ttft

    # The outgoing server's eviction lies inside [request made, request sent].
    for request, outgoing in ((cold, name_a), (back, name_b)):
        sent = request["attributes"][semconv.ATTR_CLIENT_REQUEST_SENT_NS]
        (evict,) = [s for s in _named(spans, semconv.SPAN_SWITCH)
                    if request["start_ns"] <= s["start_ns"] and s["end_ns"] <= sent]
        assert evict["attributes"][semconv.GEN_AI_REQUEST_MODEL] == outgoing
        assert evict["attributes"][semconv.ATTR_SWITCH_PROCESSES_LEFT] == 0

    # B's activation started inside the cold-switch request, from a cold page cache.
    (b_root,) = [s for s in _named(spans, semconv.SPAN_ACTIVATION)
                 if s["attributes"].get(semconv.GEN_AI_REQUEST_MODEL) == name_b]
    assert cold["start_ns"] < b_root["start_ns"] < cold["attributes"][
        semconv.ATTR_CLIENT_REQUEST_SENT_NS]
    b_reads = [s for s in _named(spans, semconv.SPAN_SHARD_READ)
               if s["trace_id"] == b_root["trace_id"]]
    assert len(b_reads) == len(tiny_model.checkpoint_files(tiny_model.ensure_tiny_model_b()))
    assert all(s["attributes"][semconv.ATTR_PAGE_CACHE_RESIDENT] < 0.5 for s in b_reads)
    assert all(s["end_ns"] - s["start_ns"] >= SLOW_READ_S * 1e9 for s in b_reads)

    # The main job on these spans: the cold switch is blamed on the slow checkpoint reads (load
    # comes before warm-up in the pipeline and grew by far more than 10 % of the increase).
    out = tmp_path / "analysis.json"
    assert cli.main(["analyze", str(receiver.store.directory), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["scenarios"]) == set(SCENARIOS)
    for r in doc["requests"]:
        assert set(r["stages"]) == set(semconv.TTFT_PIPELINE)
        assert sum(r["stages"].values()) == pytest.approx(r["client_ttft_s"], rel=0.01)
    verdicts = {v["scenario"]: v for v in doc["verdicts"]}
    cold_verdict = verdicts["cold-switch"]
    assert (cold_verdict["stage"], cold_verdict["substage"], cold_verdict["recommendation"]) == (
        "load", "load.read", "keep-resident"), cold_verdict
    assert cold_verdict["evidence"]["bytes_read_p50"] > 0
    assert cold_verdict["evidence"]["page_cache_resident_ratio_p50"] < 0.5
    # switch-back re-read A from the page cache and was not slowed: not a loading problem
    assert verdicts["switch-back"]["stage"] in ("switch", "warmup"), verdicts["switch-back"]
