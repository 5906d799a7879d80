"""gpu-check part 5 (issue 46): first-use work inside a ready GPU server's steps.

One traced start of the tiny model with CUDA graphs captured up to 16 tokens
(``--max-cudagraph-capture-size 16``) on vLLM's default model runner, then, after its first
requests:

- a prompt of a few tokens: its first prefill step ran a captured graph (``ttft.step.execution``
  ``piecewise_graph`` or ``full_graph``);
- a prompt of 100 tokens: more than any captured graph holds, so that step ran outside every
  graph (``ttft.step.cudagraph.mode`` ``NONE``, ``ttft.cudagraph.max_captured_tokens`` 16), and
  as the compiled model, not eager (``ttft.step.execution`` ``compiled``);
- a request with ``logprobs``: on Model Runner V2 (vLLM's GPU default) its logprobs are Triton
  kernels (``v1/worker/gpu/sample/logprob.py``), compiled on first use inside the step: a
  ``warmup.step_compile`` span with ``ttft.compile.compiler`` ``triton`` naming a
  ``logprob.py`` kernel (Triton's own JIT hooks timed it; Dynamo sees nothing). On the V1 runner
  the same request compiles ``batched_count_greater_than`` with torch.compile (Dynamo,
  ``ttft.compile.compiler`` ``dynamo``). A second such request pays nothing.
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


def _first_use_kernel(attrs: dict) -> bool:
    """V2's logprobs kernels (Triton) or V1's rank counting (torch.compile)."""
    frame = str(attrs.get(semconv.ATTR_COMPILE_FRAME, ""))
    if attrs.get(semconv.ATTR_COMPILE_COMPILER) == "triton":
        return frame.startswith("logprob.py:")
    return frame.endswith(":batched_count_greater_than")


def check(spans: list[dict], short: str, long: str, compiled: str, again: str) -> list[str]:
    problems = []
    found = {name: _request_span(spans, tid) for name, tid in
             (("short", short), ("long", long), ("logprobs", compiled), ("again", again))}
    for name, span in found.items():
        if span is None:
            problems.append(f"first-use: no request span for the {name} request")
    if problems:
        return problems
    short_attrs, long_attrs = found["short"]["attributes"], found["long"]["attributes"]
    short_ran = short_attrs.get(semconv.ATTR_STEP_EXECUTION)
    if short_ran not in (semconv.EXECUTION_PIECEWISE_GRAPH, semconv.EXECUTION_FULL_GRAPH):
        problems.append(f"first-use: a 5-token prefill ran {short_ran!r}, want a graph: "
                        f"{short_attrs}")
    if long_attrs.get(semconv.ATTR_STEP_CUDAGRAPH_MODE) != "NONE" or long_attrs.get(
            semconv.ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS) != MAX_CAPTURED or long_attrs.get(
            semconv.ATTR_STEP_EXECUTION) != semconv.EXECUTION_COMPILED:
        problems.append(f"first-use: a 100-token prefill: {long_attrs}, want mode NONE, "
                        f"{MAX_CAPTURED} captured tokens at most, the compiled model")
    compiles = [s for s in spans if s["trace_id"] == compiled
                and s["name"] == semconv.SPAN_TORCH_COMPILE]
    ours = [s for s in compiles if s["attributes"].get(semconv.ATTR_STAGE)
            == semconv.STAGE_WARMUP_STEP_COMPILE and _first_use_kernel(s["attributes"])]
    if not ours:
        problems.append(f"first-use: the first logprobs request shows no warmup.step_compile "
                        f"of a logprobs kernel (V2: Triton, logprob.py; V1: Dynamo, "
                        f"batched_count_greater_than): {[s['attributes'] for s in compiles]}")
    if semconv.ATTR_REQUEST_COMPILE_SECONDS in found["again"]["attributes"]:
        problems.append("first-use: the second logprobs request paid a compile too")
    for s in ours:
        print(f"gpu-check: first-use: {s['attributes']} "
              f"{(s['end_ns'] - s['start_ns']) / 1e9:.3f} s")
    print(f"gpu-check: first-use: short {short_ran}, long "
          f"{long_attrs.get(semconv.ATTR_STEP_EXECUTION)}")
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
