"""The replay puts the state each scenario names in place, and checks it, on real vLLM (CPU build,
the two tiny models, restart driver, eager templates): warm means every model a warm scenario
uses has answered its activation's cold requests; cold means the new model's checkpoint left the
page cache right before its server started, or the run says it did not.

Scenario order is chosen to keep server starts few: short-prompt first (A), then cold-switch
(A -> B) and resident-dual (B beside a fresh A): three starts; the held-mapped run: two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import environment_variables as env_names
from otel_ttft.tools import cli, tiny_model
from otel_ttft.tools.replay import evict
from otel_ttft.tools.replay.command import run_argv
from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

EAGER = DEFAULT_TEMPLATE + " " + " ".join(EAGER_ARGS)
COLD = env_names.DEFAULT_COLD_REQUESTS


def _named(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def _answered(receiver, count: int) -> list[dict]:
    """The store once ``count`` replay requests have their ``llm_request`` and the run span."""
    def complete(spans):
        parents = {s["parent_span_id"] for s in _named(spans, semconv.SPAN_REQUEST)}
        requests = _named(spans, semconv.SPAN_REPLAY_REQUEST)
        return (len(requests) == count and all(r["span_id"] in parents for r in requests)
                and _named(spans, semconv.SPAN_REPLAY_RUN))
    return receiver.wait_for_spans(complete, timeout=90)


def _replay(receiver, tmp_path: Path, scenarios: str, *extra: str) -> None:
    rc = run_argv(["--scenarios", scenarios, "--otlp-endpoint", receiver.http_endpoint,
                   "--out", str(tmp_path / "out"), "--max-tokens", "4", "--repeat-warm", "3",
                   "--serve-a", EAGER, "--serve-b", EAGER, *extra])
    assert rc == 0, f"replay failed; server logs in {tmp_path / 'out'}"


def _analyze(receiver, tmp_path: Path) -> dict:
    out = tmp_path / "analysis.json"
    assert cli.main(["analyze", str(receiver.store.directory), "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.acceptance
def test_cold_switch_is_measured_cold_and_resident_dual_is_warm(receiver, tmp_path):
    _replay(receiver, tmp_path, "short-prompt,cold-switch,resident-dual")
    spans = _answered(receiver, 3 + 1 + 2 * 3)
    (run,) = _named(spans, semconv.SPAN_REPLAY_RUN)
    assert run["attributes"][semconv.ATTR_REPLAY_REPEAT_WARM] == 3
    assert run["attributes"][semconv.ATTR_REPLAY_COLD_REQUESTS] == COLD
    llm = {s["parent_span_id"]: s for s in _named(spans, semconv.SPAN_REQUEST)}
    requests = _named(spans, semconv.SPAN_REPLAY_REQUEST)

    # Cold: B's own copy (the shared tiny B is read by every test here) measured 0 right before
    # its server started, and still cold when its shards were read.
    (cold,) = [r for r in requests
               if r["attributes"][semconv.ATTR_REPLAY_SCENARIO] == "cold-switch"]
    a = cold["attributes"]
    assert a[semconv.ATTR_REPLAY_EVICT_RESIDENT] <= semconv.COLD_RESIDENT_MAX, a
    assert a[semconv.ATTR_REPLAY_EVICT_COLD] is True and a[semconv.ATTR_REPLAY_EVICT_ATTEMPTS] == 1
    assert a[semconv.ATTR_REPLAY_WARMUP_SERVED] == 0  # a fresh server: its first request
    private = tmp_path / "out" / "models" / tiny_model.MODEL_B_NAME
    assert private.is_dir()
    b_reads = [s for s in _named(spans, semconv.SPAN_SHARD_READ)
               if s["attributes"][semconv.ATTR_SHARD_PATH].startswith(str(private))]
    assert len(b_reads) == len(tiny_model.checkpoint_files(private))
    assert all(s["attributes"][semconv.ATTR_PAGE_CACHE_RESIDENT] <= semconv.COLD_RESIDENT_MAX
               for s in b_reads)

    # Warm: every resident-dual request came after its server's cold requests (the server's own
    # count says so, not only the replay's), B's included though B had served one request only.
    dual = [r for r in requests
            if r["attributes"][semconv.ATTR_REPLAY_SCENARIO] == "resident-dual"]
    assert {r["attributes"][semconv.GEN_AI_REQUEST_MODEL] for r in dual} == {
        tiny_model.MODEL_NAME, tiny_model.MODEL_B_NAME}
    for r in dual:
        server = llm[r["span_id"]]["attributes"]
        assert r["attributes"][semconv.ATTR_REPLAY_WARMUP_SERVED] >= COLD, r["attributes"]
        assert server[semconv.ATTR_REQUEST_COLD] is False, server
        assert server[semconv.ATTR_REQUEST_ACTIVATION_INDEX] > COLD, server

    doc = _analyze(receiver, tmp_path)
    assert doc["scenarios"]["short-prompt"]["n"] == 3
    verdicts = {v["scenario"]: v for v in doc["verdicts"]}
    cold_v = verdicts["cold-switch"]
    assert cold_v["evidence"]["cold"] is True
    assert cold_v["evidence"]["checkpoint_resident_before_start"] <= semconv.COLD_RESIDENT_MAX
    assert cold_v["outcome"] == "expanded" and cold_v["chain"], cold_v
    assert [link["stage"] for link in cold_v["chain"]] == [
        s for s in semconv.TTFT_PIPELINE if s in {link["stage"] for link in cold_v["chain"]}]
    assert "not warm" not in verdicts["resident-dual"]["evidence"].get("note", "")


HOLDER = """
import mmap, sys
maps = []
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # every page mapped into this process
    maps.append(m)
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.acceptance
def test_a_checkpoint_held_mapped_is_reported_not_cold(receiver, tmp_path):
    """Another process maps B's shards and has touched every page: the kernel keeps mapped
    pages whatever the advice, so the eviction cannot take; the run must say so."""
    b = evict.private_copy(tiny_model.ensure_tiny_model_b(), tmp_path / "models")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER,
                               *map(str, evict.checkpoint_files(b))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        _replay(receiver, tmp_path, "short-prompt,cold-switch", "--model-b", str(b))
        spans = _answered(receiver, 3 + 1)
    finally:
        holder.stdin.close()
        holder.wait(30)
    (cold,) = [r for r in _named(spans, semconv.SPAN_REPLAY_REQUEST)
               if r["attributes"][semconv.ATTR_REPLAY_SCENARIO] == "cold-switch"]
    a = cold["attributes"]
    assert a[semconv.ATTR_REPLAY_EVICT_COLD] is False, a
    assert a[semconv.ATTR_REPLAY_EVICT_RESIDENT] > 0.9
    assert a[semconv.ATTR_REPLAY_EVICT_ATTEMPTS] == 2  # evicted, measured, evicted again
    assert any(h.split()[0] == str(holder.pid) for h in a[semconv.ATTR_REPLAY_EVICT_HELD_BY])

    doc = _analyze(receiver, tmp_path)
    v = next(v for v in doc["verdicts"] if v["scenario"] == "cold-switch")
    assert v["evidence"]["cold"] is False, v["evidence"]
    assert v["evidence"]["checkpoint_resident_before_start"] > 0.9
    assert "not cold" in v["evidence"]["note"]
