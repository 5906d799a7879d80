"""The request path against a real vLLM (CPU build, tiny local model), spans and metrics received
by an OTLP receiver on 127.0.0.1. A server start costs about a minute here, so each test sends
several kinds of traffic to one server and checks everything it can from that one run."""

from __future__ import annotations

import http.client
import json
import random
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.environment_variables import (
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT,
)
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV

pytestmark = pytest.mark.vllm

TTFT_STAGES = {semconv.SPAN_REQUEST_INPUT, semconv.SPAN_REQUEST_QUEUE, semconv.SPAN_REQUEST_PREFILL,
               semconv.SPAN_REQUEST_OUTPUT}
MS = 1_000_000


# --- client -----------------------------------------------------------------------------------

@dataclass
class Call:
    """One completion as the client saw it, with the traceparent it sent."""

    trace_id: str
    parent_span_id: str
    prompt: str | list[int]
    chunks: int = 0
    abandoned: bool = False
    text: list[str] = field(default_factory=list)


def complete(url: str, model: str, prompt: str | list[int], *, max_tokens: int = 4,
             stream: bool = True, abandon_after: int | None = None, timeout: float = 300) -> Call:
    """POST /v1/completions with a fresh traceparent; read the SSE stream, or drop it early."""
    call = Call(secrets.token_hex(16), secrets.token_hex(8), prompt)
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": stream})
    headers = {"Content-Type": "application/json",
               "traceparent": f"00-{call.trace_id}-{call.parent_span_id}-01"}
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise AssertionError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
        if not stream:
            call.text.append(json.loads(resp.read())["choices"][0]["text"])
            return call
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            call.chunks += 1
            call.text.append(json.loads(line[5:])["choices"][0]["text"])
            if abandon_after is not None and call.chunks >= abandon_after:
                call.abandoned = True
                break
    finally:
        conn.close()
    return call


def token_prompt(n: int, seed: int) -> list[int]:
    """``n`` token ids no other prompt starts with (no prefix-cache hits)."""
    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


def marker() -> str:
    return f"zebra{secrets.token_hex(6)}"


def write_lora_adapter(model_dir: Path, out: Path, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT LoRA adapter (q_proj, v_proj) for the tiny Llama, random weights."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    out_dims = {"q_proj": config["num_attention_heads"] * head_dim,
                "v_proj": config["num_key_value_heads"] * head_dim}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, out_dim in out_dims.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(out_dims),
        "base_model_name_or_path": str(model_dir), "inference_mode": True,
    }))
    return out


# --- reading the trees ------------------------------------------------------------------------

def request_spans(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["name"] == semconv.SPAN_REQUEST]


def children(spans: list[dict], parent: dict) -> list[dict]:
    return sorted((s for s in spans if s["parent_span_id"] == parent["span_id"]
                   and s["trace_id"] == parent["trace_id"]), key=lambda s: s["start_ns"])


def tiles(spans: list[dict], req: dict) -> list[dict]:
    """The children that tile TTFT (every stage child but first_decode)."""
    return [c for c in children(spans, req) if c["name"] in TTFT_STAGES]


def assert_tiles_ttft(spans: list[dict], req: dict) -> list[dict]:
    """Children contiguous from the request's start, summing to its TTFT within 1 ms."""
    parts = tiles(spans, req)
    assert parts, f"no stage children under {req['attributes']}"
    assert parts[0]["start_ns"] == req["start_ns"]
    for a, b in zip(parts, parts[1:], strict=False):
        assert a["end_ns"] == b["start_ns"], (a["name"], b["name"])
    total = sum(p["end_ns"] - p["start_ns"] for p in parts)
    ttft_ns = req["attributes"][semconv.ATTR_REQUEST_TTFT] * 1e9
    assert abs(total - ttft_ns) <= 1 * MS
    assert all(p["end_ns"] <= req["end_ns"] for p in children(spans, req))
    return parts


def stage_ns(spans: list[dict], req: dict, name: str) -> int:
    return sum(p["end_ns"] - p["start_ns"] for p in tiles(spans, req) if p["name"] == name)


def contains(spans: list[dict], text: str) -> bool:
    return any(text in json.dumps(s, default=str) for s in spans)


def by_trace(spans: list[dict], calls: list[Call]) -> dict[str, list[dict]]:
    reqs = request_spans(spans)
    return {c.trace_id: [r for r in reqs if r["trace_id"] == c.trace_id] for c in calls}


def wait_for_requests(receiver, n: int, timeout: float = 60) -> list[dict]:
    return receiver.wait_for_spans(lambda spans: len(request_spans(spans)) >= n, timeout)


def activation_trace_ids(spans: list[dict]) -> set[str]:
    return {s["trace_id"] for s in spans if s["name"] == semconv.SPAN_ACTIVATION}


# --- tests ------------------------------------------------------------------------------------

def test_concurrent_streams_tile_their_ttft(receiver, tiny_model, tmp_path):
    """64 concurrent streams behind 4 sequence slots, a few dropped by the client, then short vs
    long prompts: one span per request in the caller's trace, stage children that tile its TTFT,
    no prompt text exported by default, and the TTFT metrics with exemplars."""
    model = str(tiny_model)
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
    with VllmServer(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        first = complete(server.url, model, marker() + " hello", stream=False)
        prompts = [f"{marker()} request {i} " + "tell me a story " * 4 for i in range(64)]
        dropped = set(range(0, 64, 16))  # long generations, dropped after the first chunk
        with ThreadPoolExecutor(64) as pool:
            calls = list(pool.map(
                lambda i: complete(server.url, model, prompts[i],
                                   max_tokens=200 if i in dropped else 4,
                                   abandon_after=1 if i in dropped else None), range(64)))
        short, long_ = [], []
        for i in range(7):
            short.append(complete(server.url, model, token_prompt(4, seed=i)))
            long_.append(complete(server.url, model, token_prompt(500, seed=100 + i)))
        n_sent = 1 + 64 + 14
        spans = wait_for_requests(receiver, n_sent)

        def have_metrics(_spans):
            names = {p["name"] for p in receiver.store.metric_points()}
            return {semconv.METRIC_SERVER_TTFT, semconv.METRIC_REQUEST_STAGE_TIME} <= names
        receiver.wait_for_spans(have_metrics, 30)
    spans = receiver.store.spans()
    reqs = request_spans(spans)
    assert len(reqs) == n_sent  # one per request: none missing, none doubled

    # Each concurrent request: one span, in the caller's trace, tiled TTFT.
    traces = by_trace(spans, calls)
    aborted_drops = 0
    for i, call in enumerate(calls):
        assert call.chunks >= 1
        assert len(traces[call.trace_id]) == 1, f"request {i}"
        req = traces[call.trace_id][0]
        assert req["parent_span_id"] == call.parent_span_id
        assert req["kind"] == "SERVER"
        parts = assert_tiles_ttft(spans, req)
        assert [p["name"] for p in parts][0] == semconv.SPAN_REQUEST_INPUT
        assert {p["name"] for p in parts} == TTFT_STAGES
        attrs = req["attributes"]
        assert attrs[semconv.GEN_AI_REQUEST_MODEL] == model
        assert attrs[semconv.GEN_AI_OPERATION_NAME] == "text_completion"  # /v1/completions
        assert attrs[semconv.GEN_AI_PROVIDER_NAME] == "vllm"
        assert attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] > 20
        assert attrs[semconv.ATTR_REQUEST_STREAMING] is True
        assert attrs[semconv.GEN_AI_REQUEST_TEMPERATURE] == 0
        assert attrs[semconv.ATTR_REQUEST_ADMISSION_FAILED] == 0
        assert semconv.ATTR_REQUEST_ARRIVAL_KV_FREE in attrs
        if i in dropped:
            # The client left after its first chunk. If the server saw it leave before the final
            # output was handed over, the span says aborted (even when the engine had finished
            # meanwhile: test_request_abort pins that order of events). If the whole response had
            # already been handed over (a starved client thread closes late), nothing was
            # aborted and the span says so: all 200 tokens, finish reason length.
            if attrs.get(semconv.ATTR_REQUEST_ABORTED) is True:
                aborted_drops += 1
            else:
                assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 200, attrs
                assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"], attrs
        else:
            assert semconv.SPAN_REQUEST_FIRST_DECODE in {c["name"] for c in children(spans, req)}
            assert semconv.ATTR_REQUEST_ABORTED not in attrs
            assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
            assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    assert aborted_drops >= 1  # four drops: the server saw at least one client leave
    # Four sequence slots for 64 requests: the engine queue was not empty for all of them.
    waited = [traces[c.trace_id][0] for c in calls]
    assert max(r["attributes"][semconv.ATTR_REQUEST_ARRIVAL_WAITING] for r in waited) > 0
    assert max(stage_ns(spans, r, semconv.SPAN_REQUEST_QUEUE) for r in waited) > 0

    # On a warm server, prefill grows with the prompt (fastest of 7 each: noise only adds).
    t_short = [by_trace(spans, [c])[c.trace_id][0] for c in short]
    t_long = [by_trace(spans, [c])[c.trace_id][0] for c in long_]
    assert {r["attributes"][semconv.GEN_AI_USAGE_INPUT_TOKENS] for r in t_long} == {500}
    assert min(stage_ns(spans, r, semconv.SPAN_REQUEST_PREFILL) for r in t_long) > \
        min(stage_ns(spans, r, semconv.SPAN_REQUEST_PREFILL) for r in t_short)

    # Activation linkage: the first request after start is cold and links the start trace.
    (first_req,) = by_trace(spans, [first])[first.trace_id]
    attrs = first_req["attributes"]
    assert attrs[semconv.ATTR_REQUEST_COLD] is True
    assert attrs[semconv.ATTR_REQUEST_ACTIVATION_INDEX] == 1
    assert attrs[semconv.ATTR_ACTIVATION_KIND] == "start"
    assert attrs[semconv.ATTR_REQUEST_SINCE_READY] > 0
    assert attrs[semconv.ATTR_REQUEST_STREAMING] is False
    assert_tiles_ttft(spans, first_req)
    (link,) = first_req["links"]
    assert link["trace_id"] in activation_trace_ids(spans)
    assert link["attributes"][semconv.ATTR_LINK_KIND] == semconv.LINK_KIND_ACTIVATION
    assert all(r["attributes"][semconv.ATTR_REQUEST_COLD] is False for r in t_long + t_short)

    # Privacy: no prompt or output text anywhere unless opted in.
    for call in [first, *calls]:
        assert not contains(spans, call.prompt.split()[0])
    assert semconv.GEN_AI_INPUT_MESSAGES not in json.dumps([r["attributes"] for r in reqs])

    # Metrics: semconv TTFT histogram with buckets far above 10 s, time per stage, and
    # exemplars that point at request traces.
    points = receiver.store.metric_points()
    ttft = [p for p in points if p["name"] == semconv.METRIC_SERVER_TTFT]
    assert max(ttft[-1]["explicit_bounds"]) >= 600
    assert {p["attributes"][semconv.GEN_AI_REQUEST_MODEL] for p in ttft} == {model}
    assert {p["attributes"][semconv.GEN_AI_PROVIDER_NAME] for p in ttft} == {"vllm"}
    stages = {p["attributes"][semconv.ATTR_STAGE] for p in points
              if p["name"] == semconv.METRIC_REQUEST_STAGE_TIME}
    assert {"frontend", "queue", "prefill", "first_decode"} <= stages
    exemplar_traces = {e["trace_id"] for p in ttft for e in p.get("exemplars", [])}
    assert exemplar_traces & {r["trace_id"] for r in reqs}


def test_vllm_tracing_on_one_request_span_and_ttft_agrees(receiver, tiny_model, tmp_path):
    """vLLM's own tracing on, through the vLLM plugin alone, content capture opted in: still one
    request span per request, vLLM's own TTFT inside our tile, the prompt exported."""
    model = str(tiny_model)
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200",
           OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: "true"}
    # Two adapters, one CPU slot: the start-up loads evict each other, so the first request for
    # "lora-a" loads it again, inside its TTFT.
    lora_a = write_lora_adapter(Path(tiny_model), tmp_path / "lora-a")
    lora_b = write_lora_adapter(Path(tiny_model), tmp_path / "lora-b", seed=1)
    args = ("--otlp-traces-endpoint", f"{receiver.http_endpoint}/v1/traces", "--enable-lora",
            "--lora-modules", f"lora-a={lora_a}", f"lora-b={lora_b}", "--max-lora-rank", "8",
            "--max-loras", "1", "--max-cpu-loras", "1")
    with VllmServer(tiny_model, env=env, instrument=False, extra_args=args,
                    log_path=tmp_path / "server.log") as server:
        calls = [complete(server.url, model, f"{marker()} once upon a time", max_tokens=6)
                 for _ in range(6)]
        calls.append(complete(server.url, model, f"{marker()} plain", stream=False))
        lora = [complete(server.url, "lora-a", f"{marker()} adapter {i}") for i in range(2)]
        wait_for_requests(receiver, len(calls) + len(lora))
    spans = receiver.store.spans()
    assert len(request_spans(spans)) == len(calls) + len(lora)

    # The adapter: loaded inside the first lora-a request's TTFT, not again for the second.
    (r1,) = by_trace(spans, [lora[0]])[lora[0].trace_id]
    (r2,) = by_trace(spans, [lora[1]])[lora[1].trace_id]
    for r in (r1, r2):
        assert r["attributes"][semconv.ATTR_LORA_NAME] == "lora-a"
        assert r["attributes"][semconv.GEN_AI_REQUEST_MODEL] == "lora-a"
        assert_tiles_ttft(spans, r)
    assert r1["attributes"][semconv.ATTR_LORA_LOAD_SECONDS] > 0
    assert r1["attributes"][semconv.ATTR_REQUEST_COLD] is True
    assert r1["attributes"][semconv.ATTR_ACTIVATION_KIND] == "adapter"
    assert semconv.ATTR_LORA_LOAD_SECONDS not in r2["attributes"]
    ttft_end = r1["start_ns"] + r1["attributes"][semconv.ATTR_REQUEST_TTFT] * 1e9
    loads = [c for p in tiles(spans, r1) for c in children(spans, p)
             if c["name"] == semconv.SPAN_ADAPTER_LOAD]
    assert len(loads) == 1
    assert r1["start_ns"] <= loads[0]["start_ns"] <= loads[0]["end_ns"] <= ttft_end
    assert loads[0]["attributes"][semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_ADAPTER
    for call in calls:
        (req,) = by_trace(spans, [call])[call.trace_id]
        attrs = req["attributes"]
        assert req["parent_span_id"] == call.parent_span_id
        assert_tiles_ttft(spans, req)
        # vLLM's TTFT ends when the API process took the first token, ours when its chunk was
        # written to the client: the difference lies inside our "Frontend output" segment (a
        # fixed bound in ms would only measure how busy the machine was).
        ours, vllms = attrs[semconv.ATTR_REQUEST_TTFT], attrs[semconv.VLLM_LATENCY_TTFT]
        output_s = stage_ns(spans, req, semconv.SPAN_REQUEST_OUTPUT) / 1e9
        assert -0.001 <= ours - vllms <= output_s + 0.001, (ours, vllms, output_s)
        assert attrs["gen_ai.latency.time_in_queue"] >= 0  # vLLM's own attributes, carried over
        # Opted in: the prompt and the output text are exported.
        (message,) = json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES])
        assert message["parts"][0]["content"] == call.prompt
        (answer,) = json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])
        assert answer["parts"][0]["content"] == "".join(call.text)


def test_blocked_admission_and_compile_inside_the_first_request(receiver, tiny_model, tmp_path):
    """Six KV blocks, vLLM's stats logging off, compile skipped at start-up (VLLM_CPU_CI_ENV=1):
    the first request carries the compile and links the activation; long prompts that found no
    free blocks show queue time and how often admission failed."""
    model = str(tiny_model)
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "VLLM_CPU_CI_ENV": "1"}
    args = ("--num-gpu-blocks-override", "6", "--disable-log-stats")
    with VllmServer(tiny_model, env=env, extra_args=args,
                    log_path=tmp_path / "server.log") as server:
        first = complete(server.url, model, "compile me")
        with ThreadPoolExecutor(6) as pool:  # 300 tokens = 3 of the 6 blocks of 128 each
            blocked = list(pool.map(lambda i: complete(server.url, model,
                                                        token_prompt(300, seed=200 + i),
                                                        max_tokens=16), range(6)))
        wait_for_requests(receiver, 1 + 6)
    spans = receiver.store.spans()
    assert len(request_spans(spans)) == 7

    # Compile inside the first request: said on its span, a child of its prefill, and linked.
    (req,) = by_trace(spans, [first])[first.trace_id]
    attrs = req["attributes"]
    assert attrs[semconv.ATTR_REQUEST_COLD] is True
    assert attrs[semconv.ATTR_REQUEST_ACTIVATION_INDEX] == 1
    assert attrs[semconv.ATTR_REQUEST_COMPILE_SECONDS] > 0
    (link,) = req["links"]
    assert link["trace_id"] in activation_trace_ids(spans)
    parts = assert_tiles_ttft(spans, req)
    compiles = [c for p in parts for c in children(spans, p)
                if c["name"] == semconv.SPAN_TORCH_COMPILE]
    assert compiles and all(c["attributes"][semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_COMPILE
                            for c in compiles), [c["attributes"] for c in compiles]
    prefill = next(p for p in parts if p["name"] == semconv.SPAN_REQUEST_PREFILL)
    assert all(prefill["start_ns"] <= c["start_ns"] <= c["end_ns"] <= prefill["end_ns"]
               for c in compiles)
    # One wrapper on monitor_torch_compile: a compile inside a request step is shown once, in
    # the request's tree, never as a worker span of its own (no parent: an orphan trace).
    assert not [c for c in spans if c["name"] == semconv.SPAN_TORCH_COMPILE
                and c["parent_span_id"] is None]
    later = [by_trace(spans, [c])[c.trace_id][0] for c in blocked]
    assert not any(semconv.ATTR_REQUEST_COMPILE_SECONDS in r["attributes"] for r in later)

    # Blocked admission, with vLLM's stats logging off: queue and prefill still split (the
    # engine's own admission times), and the requests that found no blocks say how often.
    for r in later:
        assert r["attributes"][semconv.ATTR_REQUEST_SCHEDULE_KNOWN] is True
        assert r["attributes"][semconv.ATTR_REQUEST_ARRIVAL_KV_TOTAL] == 6
        assert_tiles_ttft(spans, r)
    failed = [r for r in later if r["attributes"][semconv.ATTR_REQUEST_ADMISSION_FAILED] > 0]
    assert failed, [r["attributes"] for r in later]
    assert all(stage_ns(spans, r, semconv.SPAN_REQUEST_QUEUE) > 0 for r in failed)
    assert min(r["attributes"][semconv.ATTR_REQUEST_ARRIVAL_KV_FREE] for r in later) < 6


OFFLINE_SCRIPT = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from otel_ttft.runtime.instrumentor import instrument_once
instrument_once()
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], enforce_eager=True, dtype="float32",
          kv_cache_memory_bytes=64 << 20, max_model_len=512)
llm.generate(["hello world", "one two three four", "a b c"],
             SamplingParams(max_tokens=4, ignore_eos=True))
print("SPANS" + json.dumps([
    {"name": s.name, "trace_id": format(s.context.trace_id, "032x"),
     "span_id": format(s.context.span_id, "016x"),
     "parent_span_id": format(s.parent.span_id, "016x") if s.parent else None,
     "start_ns": s.start_time, "end_ns": s.end_time, "attributes": dict(s.attributes)}
    for s in exporter.get_finished_spans()]))
"""


def test_offline_llm_engine_requests(tiny_model, tmp_path):
    """Offline ``LLM.generate`` (one process, no ``AsyncLLM.generate``): the same tree per request,
    closed when the OutputProcessor finishes it, with the engine's counts passed in-process."""
    script = tmp_path / "offline.py"
    script.write_text(OFFLINE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tiny_model)], capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SPANS")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    spans = json.loads(lines[0][len("SPANS"):])
    reqs = request_spans(spans)
    assert len(reqs) == 3
    for req in reqs:
        assert req["parent_span_id"] is None
        parts = assert_tiles_ttft(spans, req)
        assert {p["name"] for p in parts} == TTFT_STAGES
        attrs = req["attributes"]
        assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
        assert attrs[semconv.ATTR_REQUEST_SCHEDULE_KNOWN] is True
        assert semconv.ATTR_REQUEST_ARRIVAL_KV_FREE in attrs  # EngineCore's counts, in-process
