"""A compile during serving against a real vLLM (CPU build, tiny local model): the server is
ready, its first requests are done, then a request asks for logprobs. vLLM computes their ranks
with a function of its own under ``torch.compile`` (``batched_count_greater_than``), compiled on
its first call: this request pays a real Dynamo and Inductor compile inside its step. Its tree
shows it as ``warmup.step_compile`` with what was compiled and the step's shape; its Prefill
keeps the rest; the requests around it show none; ``otel-ttft analyze`` on the same traces
names the sub-stage and its fix."""

from __future__ import annotations

import http.client
import json
import secrets
from urllib.parse import urlparse

import pytest

from otel_ttft import semconv
from otel_ttft.tools import cli
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.test_request_vllm import (
    assert_tiles_ttft,
    by_trace,
    children,
    complete,
    token_prompt,
    wait_for_requests,
)

pytestmark = pytest.mark.vllm

COMPILED = "batched_count_greater_than"  # vLLM's own torch.compile'd helper for logprob ranks


def _with_logprobs(url: str, model: str, prompt: list[int]) -> str:
    """A non-streamed completion asking for 2 logprobs per token; returns its trace id."""
    trace_id = secrets.token_hex(16)
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                       "ignore_eos": True, "logprobs": 2})
    try:
        conn.request("POST", "/v1/completions", body=body, headers={
            "Content-Type": "application/json",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 200, answer
    assert answer["choices"][0]["logprobs"]["top_logprobs"], answer  # the path that compiles
    return trace_id


def test_a_compile_inside_a_ready_servers_step_is_named_with_what_compiled(
        receiver, tiny_model, tmp_path):
    model = str(tiny_model)
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_TTFT_REQUEST_DETAIL": semconv.DETAIL_SPANS}
    prompt = token_prompt(24, seed=3)
    with VllmServer(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        before = [complete(server.url, model, token_prompt(24, seed=10 + i)) for i in range(4)]
        compiled = _with_logprobs(server.url, model, prompt)
        again = _with_logprobs(server.url, model, token_prompt(24, seed=4))
        after = [complete(server.url, model, token_prompt(24, seed=20 + i)) for i in range(3)]
        wait_for_requests(receiver, 9)
    spans = receiver.store.spans()
    reqs = by_trace(spans, [*before, *after])

    (req,) = [s for s in spans if s["trace_id"] == compiled and s["name"] == semconv.SPAN_REQUEST]
    parts = assert_tiles_ttft(spans, req)
    prefill = next(p for p in parts if p["name"] == semconv.SPAN_REQUEST_PREFILL)
    found = [c for p in parts for c in children(spans, p)
             if c["name"] == semconv.SPAN_TORCH_COMPILE]
    assert found, [c["name"] for p in parts for c in children(spans, p)]
    ours = [c for c in found if c["attributes"].get(semconv.ATTR_COMPILE_FRAME, "")
            .endswith(":" + COMPILED)]
    assert len(ours) == 1, [c["attributes"] for c in found]
    (span,) = ours
    evidence = span["attributes"]
    assert evidence[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_STEP_COMPILE
    assert evidence[semconv.ATTR_COMPILE_MODEL_GRAPH] is False  # a helper, not the model
    assert evidence[semconv.ATTR_COMPILE_RECOMPILE] is False  # its first compile
    assert "/" in evidence[semconv.ATTR_COMPILE_ID]
    # The step it ran in: this request alone, its 24 prompt tokens (a prefill step)
    assert evidence[semconv.ATTR_STEP_REQUESTS] == 1
    assert evidence[semconv.ATTR_STEP_TOKENS] == len(prompt)
    # Inside the Prefill that waited for it: the rest of that Prefill is the request's own
    assert prefill["start_ns"] <= span["start_ns"] <= span["end_ns"] <= prefill["end_ns"]
    compile_s = sum((c["end_ns"] - c["start_ns"]) / 1e9 for c in found)
    assert req["attributes"][semconv.ATTR_REQUEST_COMPILE_SECONDS] == pytest.approx(compile_s)
    assert req["attributes"][semconv.ATTR_REQUEST_COLD] is True

    # Compiled once per process: the second such request, and the plain ones, pay nothing.
    (second,) = [s for s in spans if s["trace_id"] == again and s["name"] == semconv.SPAN_REQUEST]
    for other in [second, *(r for rs in reqs.values() for r in rs)]:
        assert semconv.ATTR_REQUEST_COMPILE_SECONDS not in other["attributes"]
        assert not [c for c in spans if c["parent_span_id"] == other["span_id"]
                    and c["name"] == semconv.SPAN_TORCH_COMPILE]

    # analyze, on the same traces: live traffic splits into the model's first requests (the
    # activation's first, and this one, which waited for a compile) against its warm ones.
    out = tmp_path / "analysis.json"
    assert cli.main(["analyze", str(tmp_path / "store"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = [r for r in doc["requests"] if r["trace_id"] == compiled]
    assert row["substages"][semconv.STAGE_WARMUP_STEP_COMPILE] == pytest.approx(
        (span["end_ns"] - span["start_ns"]) / 1e9, abs=1e-5)
    (verdict,) = [v for v in doc["verdicts"] if v["scenario"] == row["scenario"]]
    assert verdict["stage"] == semconv.STAGE_WARMUP, verdict["summary"]
    # the first group holds the server's cold requests too (issue 56): the compile is one of its
    # warm-up sub-stages, beside the activation's first request's first-use work
    assert verdict["substage"] in (semconv.STAGE_WARMUP_STEP_COMPILE,
                                   semconv.STAGE_WARMUP_FIRST_USE), verdict["summary"]
    assert verdict["recommendation"] == "warm-up", verdict["summary"]
