"""The live verdict against a real vLLM (CPU build, tiny local model), exported over OTLP to the
project's receiver: a first start says it has no baseline; a second start with a delay planted in
its memory profiling run names ``warmup.profile`` and the fix in vLLM's own flags (the vocabulary
shipped for this vLLM), on a child span of its activation judged after ready, in its log and in
the ``ttft.activation.verdict`` gauge, and ``analyze``'s reading of the same traces gives the
same verdict; a start whose history file is a FIFO starts and says "no baseline". Each start
costs about a minute here."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import activation_history
from otel_ttft.tools.analysis import activations as analyze_activations
from otel_ttft.tools.analysis.breakdown import collect
from otel_ttft.tools.analysis.traces import find_activation_roots
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.vllm_args import EAGER_ARGS
from tests.vllm_plants import plugin_dir

pytestmark = pytest.mark.vllm

COLD = 2  # cold requests per activation (OTEL_TTFT_COLD_REQUESTS), each ends the second verdict
ARGS = (*EAGER_ARGS, "--max-model-len", "512", "--max-num-seqs", "4")


def _complete(server: VllmServer, model: Path) -> None:
    body = json.dumps({"model": str(model), "prompt": "hello world", "max_tokens": 2,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def _start(receiver, tiny_model, tmp_path, name, history, extra_env=None):
    """One start, its cold requests served; returns (activation root, its verdict at ready, its
    verdict after the cold requests, log). Both verdicts are child spans of the activation: the
    rule runs in a thread after ready, once the activation span has ended."""
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_TTFT_VERDICT_HISTORY": str(history), "OTEL_TTFT_COLD_REQUESTS": str(COLD),
           **(extra_env or {})}
    log = tmp_path / f"{name}.log"
    with VllmServer(tiny_model, env=env, extra_args=ARGS, log_path=log) as server:
        for _ in range(COLD):
            _complete(server, tiny_model)

        def judged(spans):
            by_trace: dict[str, dict] = {}
            for s in spans:
                if s["name"] == semconv.SPAN_ACTIVATION_VERDICT and s["trace_id"] not in _seen:
                    by_trace.setdefault(s["trace_id"], {})[
                        s["attributes"].get(semconv.ATTR_VERDICT_PHASE)] = s
            return [v for v in by_trace.values() if set(v) == set(semconv.VERDICT_PHASES)]
        spans = receiver.wait_for_spans(judged, 90)
        (both,) = judged(spans)
        ready, cold = (both[phase] for phase in semconv.VERDICT_PHASES)
        _seen.add(ready["trace_id"])
    roots = [r for r in find_activation_roots(receiver.store.spans())
             if r.trace_id == ready["trace_id"]]
    assert not any(k.startswith("ttft.verdict.") for k in roots[0].attributes)
    return roots[0], ready, cold, log.read_text(errors="replace")


_seen: set[str] = set()


def _verdict_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "otel-ttft: this start of" in line]


def test_each_start_explains_itself(receiver, tiny_model, tmp_path):
    _seen.clear()
    history = tmp_path / "cache" / "activations.json"

    # 1. The first start of this model and configuration: what it measured, no baseline yet.
    first, ready, first_child, log = _start(receiver, tiny_model, tmp_path, "first", history)
    attrs = ready["attributes"]
    assert attrs[semconv.ATTR_VERDICT_OUTCOME] == semconv.VERDICT_NO_BASELINE
    assert attrs[semconv.ATTR_VERDICT_PHASE] == semconv.VERDICT_PHASE_READY
    assert attrs[semconv.ATTR_VERDICT_DURATION_S] == pytest.approx(
        (first.end_ns - first.start_ns) / 1e9, abs=1e-3)
    lines = _verdict_lines(log)
    assert len(lines) == 2 and all("no baseline yet" in line for line in lines), lines
    assert first_child["attributes"][semconv.ATTR_VERDICT_PHASE] == "cold_requests"
    # the start's own record (the stop's eviction is a record of kind "switch" beside it)
    (saved,) = [r for r in activation_history.load(history).records if r.get("kind") == "start"]
    assert saved["id"] == first.trace_id and saved["cold"]["requests"] == COLD

    # 2. The same start with its memory profiling run made slow (a delay planted in vLLM's CPU
    # memory probe, FACTOR x the worker's age: well over the alert's 10 s and 2x).
    plant = plugin_dir(tmp_path, "profile")
    slow_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(plant),
                                                            os.environ.get("PYTHONPATH")])),
                "TTFT_TEST_FACTOR": "3"}
    second, ready, second_child, log = _start(receiver, tiny_model, tmp_path, "second", history,
                                              slow_env)
    attrs = ready["attributes"]
    assert attrs[semconv.ATTR_VERDICT_OUTCOME] == "expanded", attrs[semconv.ATTR_VERDICT_SUMMARY]
    assert attrs[semconv.ATTR_VERDICT_BASELINE] == "thin"
    assert attrs[semconv.ATTR_VERDICT_STAGE] == semconv.STAGE_WARMUP
    assert attrs[semconv.ATTR_VERDICT_SUBSTAGE] == semconv.STAGE_WARMUP_PROFILE
    # The planted delay is the profile run's own increase; the stage's can be smaller where its
    # other parts came out faster this time (imports with a warm page cache, a quieter machine).
    assert attrs[semconv.ATTR_VERDICT_SUBSTAGE_INCREASE_S] > 10
    assert attrs[semconv.ATTR_VERDICT_INCREASE_S] > 0
    assert attrs[semconv.ATTR_VERDICT_RECOMMENDATION] == "persist-artifacts"
    change = list(attrs[semconv.ATTR_VERDICT_CHANGE])
    assert change[0] == "--kv-cache-memory-bytes" and int(change[1]) > 0, change
    from vllm.engine.arg_utils import EngineArgs

    assert "kv_cache_memory_bytes" in EngineArgs.__dataclass_fields__  # vLLM's own knob
    (line, cold_line) = _verdict_lines(log)
    assert re.search(r"more than the last start of this model .*earliest stage that grew: "
                     r"warmup\.profile \+\d+\.\d s \(warmup \+\d+\.\d s in all\); "
                     r"persist-artifacts: --kv-cache-memory-bytes \d+", line), line
    assert "thin baseline (1 earlier)" in line
    assert second_child["attributes"][semconv.ATTR_VERDICT_SUBSTAGE] == \
        semconv.STAGE_WARMUP_PROFILE
    assert "to its cold requests' first tokens" in cold_line

    # The gauge, over real OTLP: the blamed stage and the fix, for this activation.
    def verdict_points(_spans):
        return [p for p in receiver.store.metric_points()
                if p["name"] == semconv.METRIC_ACTIVATION_VERDICT
                and p["attributes"].get(semconv.ATTR_ACTIVATION_TRACE_ID) == second.trace_id]
    receiver.wait_for_spans(verdict_points, 30)
    point = verdict_points(None)[-1]
    assert point["attributes"][semconv.ATTR_STAGE] == semconv.STAGE_WARMUP
    assert point["attributes"][semconv.ATTR_VERDICT_SUBSTAGE] == semconv.STAGE_WARMUP_PROFILE
    assert point["attributes"][semconv.ATTR_VERDICT_CHANGE].startswith("--kv-cache-memory-bytes")
    assert point["value"] > 10

    # The same inputs through analyze's code: its reading of the two traces, one rule.
    collected = collect([receiver.store.spans()])
    summaries = {a.trace_id: a for a in collected.activations}
    key = saved["key"]
    earlier = [analyze_activations.record(summaries[first.trace_id], key, at=1.0)]
    again = analyze_activations.judge(summaries[second.trace_id], earlier, key)
    assert (again["outcome"], again["stage"], again["substage"], again["recommendation"]) == (
        "expanded", semconv.STAGE_WARMUP, semconv.STAGE_WARMUP_PROFILE, "persist-artifacts")


def test_a_fifo_for_a_history_file_is_no_baseline(receiver, tiny_model, tmp_path):
    _seen.clear()
    history = tmp_path / "activations.json"
    os.mkfifo(history)
    _root, ready, _cold, log = _start(receiver, tiny_model, tmp_path, "fifo", history)
    assert ready["attributes"][semconv.ATTR_VERDICT_OUTCOME] == semconv.VERDICT_NO_BASELINE
    lines = _verdict_lines(log)
    assert lines and "is not a regular file" in lines[0], lines
    assert history.is_fifo()
