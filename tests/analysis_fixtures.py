"""Synthetic traces shaped like what vLLM, our hooks and the replay emit, for analysis tests.

Times are seconds from an arbitrary epoch; every builder returns normalized span dicts (the shape
``otel_ttft.tools.sink`` stores)."""

from __future__ import annotations

import itertools
import json

from otel_ttft import semconv

T0 = 1_700_000_000_000_000_000
_ids = itertools.count(1)


def new_trace() -> str:
    return f"{next(_ids):032x}"


def span(trace_id: str, name: str, start_s: float, end_s: float, parent: dict | None = None,
         stage: str | None = None, links: list | None = None, kind: str = "INTERNAL",
         **attrs) -> dict:
    attributes = dict(attrs)
    if stage:
        attributes[semconv.ATTR_STAGE] = stage
    return {
        "trace_id": trace_id, "span_id": f"{next(_ids):016x}",
        "parent_span_id": parent["span_id"] if parent else None,
        "name": name, "kind": kind,
        "start_ns": T0 + int(start_s * 1e9), "end_ns": T0 + int(end_s * 1e9),
        "attributes": attributes, "resource": {}, "scope": "test", "events": [],
        "links": links or [], "status": {"code": "UNSET", "message": ""},
    }


def run_span(run_id: str = "run1", concurrency: int = 1, max_tokens: int = 16,
             driver: str = "restart") -> list[dict]:
    return [span(new_trace(), semconv.SPAN_REPLAY_RUN, 0, 1000, **{
        semconv.ATTR_REPLAY_RUN_ID: run_id, semconv.ATTR_REPLAY_DRIVER: driver,
        semconv.ATTR_REPLAY_MODELS: ["A", "B"], semconv.ATTR_REPLAY_CLIENT: "test-client",
        semconv.ATTR_REPLAY_SAMPLING: json.dumps({"temperature": 0, "max_tokens": max_tokens}),
        semconv.ATTR_REPLAY_CONCURRENCY: concurrency,
        semconv.ATTR_REPLAY_PROMPTS: json.dumps({"short": {"tokens": 10}}),
        semconv.ATTR_REPLAY_REPEAT: 1})]


def activation(model: str, start: float, *, process_start: float = 3.0, read: float = 1.0,
               compile_s: float = 2.0, other: float = 1.0, bytes_read: int = 4_000_000,
               resident: float = 0.0, cache_hit: bool = False) -> list[dict]:
    """An activation trace: process start, load (a shard read inside), compile, KV alloc."""
    t = new_trace()
    end = start + process_start + read + 0.5 + compile_s + other
    root = span(t, semconv.SPAN_ACTIVATION, start, end, **{
        semconv.GEN_AI_REQUEST_MODEL: model, semconv.ATTR_ACTIVATION_KIND: "start"})
    out = [root]
    s = start
    out.append(span(t, semconv.SPAN_PROCESS_START, s, s + process_start, root,
                    semconv.STAGE_WARMUP_PROCESS_START))
    s += process_start
    weights = span(t, "Load weights", s, s + read + 0.5, root, semconv.STAGE_LOAD)
    out.append(weights)
    out.append(span(t, semconv.SPAN_SHARD_READ, s + 0.25, s + 0.25 + read, weights,
                    semconv.STAGE_LOAD_READ, **{semconv.ATTR_SHARD_BYTES: bytes_read,
                                                semconv.ATTR_PAGE_CACHE_RESIDENT: resident}))
    s += read + 0.5
    out.append(span(t, semconv.SPAN_TORCH_COMPILE, s, s + compile_s, root,
                    semconv.STAGE_WARMUP_COMPILE, **{semconv.ATTR_COMPILE_CACHE_HIT: cache_hit}))
    s += compile_s
    out.append(span(t, semconv.SPAN_KV_ALLOC, s, s + other, root, semconv.STAGE_WARMUP_KV_ALLOC))
    return out


def switch(model: str, start: float, duration: float) -> list[dict]:
    return [span(new_trace(), semconv.SPAN_SWITCH, start, start + duration, None,
                 semconv.STAGE_SWITCH, **{semconv.GEN_AI_REQUEST_MODEL: model,
                                          semconv.ATTR_SWITCH_REASON: "signal"})]


def request(scenario: str, model: str, made: float, arrival: float, *, frontend_in: float = 0.002,
            queue: float = 0.001, prefill: float = 0.010, frontend_out: float = 0.002,
            network_out: float = 0.001, tokens: int = 10, compile_in_prefill: float = 0.0,
            activation_trace: str | None = None, run_id: str = "run1", waiting: int = 0,
            activation_index: int = 5, cached: int | None = None) -> list[dict]:
    """A replay.request (made at ``made``) whose llm_request arrives at ``arrival``;
    ``cached``: prompt tokens vLLM read from its prefix cache."""
    t = new_trace()
    prefill += compile_in_prefill
    server_ttft = frontend_in + queue + prefill + frontend_out
    client_ttft = arrival - made + server_ttft + network_out
    client = span(t, semconv.SPAN_REPLAY_REQUEST, made, made + client_ttft + 0.05, kind="CLIENT",
                  **{semconv.ATTR_REPLAY_RUN_ID: run_id, semconv.ATTR_REPLAY_SCENARIO: scenario,
                     semconv.GEN_AI_REQUEST_MODEL: model, semconv.ATTR_REPLAY_PROMPT: "short",
                     semconv.ATTR_CLIENT_TTFT: client_ttft})
    links = []
    if activation_trace:
        links = [{"trace_id": activation_trace, "span_id": "00" * 8,
                  "attributes": {semconv.ATTR_LINK_KIND: semconv.LINK_KIND_ACTIVATION}}]
    server = span(t, semconv.SPAN_REQUEST, arrival, arrival + server_ttft + 0.05, client,
                  links=links, kind="SERVER", **{
                      semconv.ATTR_REQUEST_TTFT: server_ttft,
                      semconv.GEN_AI_USAGE_INPUT_TOKENS: tokens,
                      semconv.GEN_AI_REQUEST_MODEL: model,
                      semconv.ATTR_REQUEST_ARRIVAL_WAITING: waiting,
                      semconv.ATTR_REQUEST_ACTIVATION_INDEX: activation_index})
    if cached is not None:
        server["attributes"][semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cached
    out = [client, server]
    s = arrival
    for name, stage, dur in ((semconv.SPAN_REQUEST_INPUT, semconv.STAGE_FRONTEND, frontend_in),
                             (semconv.SPAN_REQUEST_QUEUE, semconv.STAGE_QUEUE, queue),
                             (semconv.SPAN_REQUEST_PREFILL, semconv.STAGE_PREFILL, prefill),
                             (semconv.SPAN_REQUEST_OUTPUT, semconv.STAGE_FRONTEND, frontend_out)):
        child = span(t, name, s, s + dur, server, stage)
        out.append(child)
        if name == semconv.SPAN_REQUEST_PREFILL and compile_in_prefill:
            out.append(span(t, semconv.SPAN_TORCH_COMPILE, s + 0.001,
                            s + 0.001 + compile_in_prefill, child, semconv.STAGE_WARMUP_COMPILE))
        s += dur
    out.append(span(t, semconv.SPAN_REQUEST_FIRST_DECODE, s, s + 0.01, server,
                    semconv.STAGE_FIRST_DECODE))
    return out


def warm_requests(scenario: str, model: str, start: float, n: int = 4, **kw) -> list[dict]:
    out = []
    for i in range(n):
        made = start + i * 1.0
        out += request(scenario, model, made, made + 0.001, **kw)
    return out


def cold_switch_run(*, read: float = 1.0, process_start: float = 3.0, long_prompt: bool = False
                    ) -> list[dict]:
    """A: warm; B requested at t=100 (A evicted in 2 s, B activated), then warm baselines."""
    spans = run_span()
    spans += switch("A", 100.01, 2.0)
    act = activation("B", 102.2, read=read, process_start=process_start)
    spans += act
    ready = (act[0]["end_ns"] - T0) / 1e9
    kw = {"prefill": 0.4, "tokens": 400} if long_prompt else {}
    spans += request(semconv.SCENARIO_COLD_SWITCH, "B", 100.0, ready + 0.05,
                     activation_trace=act[0]["trace_id"], activation_index=1, **kw)
    spans += warm_requests(semconv.SCENARIO_SHORT_PROMPT, "B", 200.0)
    return spans
