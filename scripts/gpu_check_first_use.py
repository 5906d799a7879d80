"""gpu-check part 5 (issue 46): first-use work inside a ready GPU server's steps.

One traced start of the tiny model with CUDA graphs captured up to 16 tokens
(``--max-cudagraph-capture-size 16``) on vLLM's default model runner, then, after its first
requests:

- a prompt of a few tokens: its first prefill step ran a captured graph (``ttft.step.cudagraph.
  mode`` is not ``NONE``);
- a prompt of 100 tokens: more than any captured graph holds, so that step ran eager (``NONE``,
  with ``ttft.cudagraph.max_captured_tokens`` 16);
- a request with ``logprobs``: vLLM compiles its rank counting on first use, Inductor generating
  and autotuning Triton kernels for it inside the step: a ``warmup.step_compile`` span naming
  ``batched_count_greater_than``; a second such request pays nothing.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import urllib.request
from pathlib import Path

from otel_ttft import semconv
from otel_ttft.tools.replay.server import VllmServer, telemetry_env
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore

MAX_CAPTURED = 16


def _complete(url: str, model: str, prompt: list[int], **extra: object) -> str:
    """A completion with a fresh traceparent; its trace id."""
    trace_id = secrets.token_hex(16)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                       "ignore_eos": True, **extra}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={
        "Content-Type": "application/json",
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        json.loads(resp.read())
    return trace_id


def _request_span(spans: list[dict], trace_id: str) -> dict | None:
    return next((s for s in spans if s["trace_id"] == trace_id
                 and s["name"] == semconv.SPAN_REQUEST), None)


def check(spans: list[dict], short: str, long: str, compiled: str, again: str) -> list[str]:
    problems = []
    found = {name: _request_span(spans, tid) for name, tid in
             (("short", short), ("long", long), ("logprobs", compiled), ("again", again))}
    for name, span in found.items():
        if span is None:
            problems.append(f"first-use: no request span for the {name} request")
    if problems:
        return problems
    short_mode = found["short"]["attributes"].get(semconv.ATTR_STEP_CUDAGRAPH_MODE)
    if short_mode in (None, "NONE"):
        problems.append(f"first-use: a 5-token prefill ran mode {short_mode!r}, want a graph")
    long_attrs = found["long"]["attributes"]
    if long_attrs.get(semconv.ATTR_STEP_CUDAGRAPH_MODE) != "NONE" or long_attrs.get(
            semconv.ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS) != MAX_CAPTURED:
        problems.append(f"first-use: a 100-token prefill: {long_attrs}, want mode NONE and "
                        f"{MAX_CAPTURED} captured tokens at most")
    compiles = [s for s in spans if s["trace_id"] == compiled
                and s["name"] == semconv.SPAN_TORCH_COMPILE]
    ours = [s for s in compiles if s["attributes"].get(semconv.ATTR_STAGE)
            == semconv.STAGE_WARMUP_STEP_COMPILE and s["attributes"].get(
                semconv.ATTR_COMPILE_FRAME, "").endswith(":batched_count_greater_than")]
    if not ours:
        problems.append(f"first-use: the first logprobs request shows no warmup.step_compile "
                        f"of batched_count_greater_than: {[s['attributes'] for s in compiles]}")
    if semconv.ATTR_REQUEST_COMPILE_SECONDS in found["again"]["attributes"]:
        problems.append("first-use: the second logprobs request paid a compile too")
    for s in ours:
        print(f"gpu-check: first-use: {s['attributes']} "
              f"{(s['end_ns'] - s['start_ns']) / 1e9:.3f} s")
    print(f"gpu-check: first-use: short {short_mode}, long "
          f"{long_attrs.get(semconv.ATTR_STEP_CUDAGRAPH_MODE)}")
    return problems


def run_first_use(model: Path, out: Path, timeout: float) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    store = SpanStore(out / "store")
    with OTLPReceiver(store) as receiver:
        env = {**telemetry_env(receiver.http_endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200",
               "OTEL_TTFT_REQUEST_DETAIL": semconv.DETAIL_SPANS}
        server = VllmServer(model, env=env, log_path=out / "vllm-server.log",
                            extra_args=("--gpu-memory-utilization", "0.3",
                                        "--max-cudagraph-capture-size", str(MAX_CAPTURED)))
        server.start(timeout_s=timeout)
        name = str(model)
        try:
            for i in range(3):  # the activation's cold requests
                _complete(server.url, name, [11 + i, 12, 13, 14, 15])
            short = _complete(server.url, name, [21, 22, 23, 24, 25])
            long = _complete(server.url, name, [30 + (i % 900) for i in range(100)])
            compiled = _complete(server.url, name, [41, 42, 43, 44, 45], logprobs=2)
            again = _complete(server.url, name, [51, 52, 53, 54, 55], logprobs=2)
        finally:
            server.stop()
        ids = (short, long, compiled, again)
        with contextlib.suppress(TimeoutError):
            receiver.wait_for_spans(lambda s: all(_request_span(s, t) for t in ids), timeout=30)
    return check(store.spans(), *ids)
