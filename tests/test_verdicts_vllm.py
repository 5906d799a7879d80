"""Verdicts on a real vLLM (CPU build, tiny model) where the test made the cause, read back over
real OTLP from the embedded store, through `otel-ttft analyze`.

One server, started with compile skipped at start-up (``VLLM_CPU_CI_ENV=1``, so the first
request carries the torch.compile), a 2,048-token context (a long prompt's prefill takes four
512-token chunks, so it dominates its extra tokenizing even on a loaded machine), prefix caching
off (repeats of one prompt would otherwise share its blocks and skip its prefill) and 17 KV
blocks of 128 tokens (one long prompt takes 16, so concurrent ones wait for admission). Two
replay runs with fixed client settings each: concurrency 1 (first request, warm short prompts,
long prompts) and concurrency 6 (short prompts that fit, long ones that do not).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import environment_variables as env_names
from otel_ttft.tools import cli
from otel_ttft.tools.replay.client import ChatClient, Sampling, make_tracer_provider
from otel_ttft.tools.replay.prompts import build_prompts, tokenizer_counter
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV

pytestmark = pytest.mark.vllm

MAX_MODEL_LEN = 2048  # the tiny model's positions; a long prompt takes 16 of the 17 KV blocks
KV_BLOCKS = 17


def _run(tracer, run_id: str, concurrency: int, prompts, steps, url: str, model: str,
         max_tokens: int = 8) -> None:
    """One replay run span; ``steps`` are (scenario, prompt kind, how many) in order; a step
    whose scenario is None is that many untraced requests (the server's cold ones)."""
    from concurrent.futures import ThreadPoolExecutor

    from opentelemetry import context as otel_context

    client = ChatClient(tracer, Sampling(max_tokens=max_tokens))
    run = tracer.start_span(semconv.SPAN_REPLAY_RUN, context=otel_context.Context(), attributes={
        semconv.ATTR_REPLAY_RUN_ID: run_id, semconv.ATTR_REPLAY_DRIVER: "resident",
        semconv.ATTR_REPLAY_MODELS: [model], semconv.ATTR_REPLAY_CLIENT: "verdict-test",
        semconv.ATTR_REPLAY_SAMPLING: client.sampling.record(),
        semconv.ATTR_REPLAY_CONCURRENCY: concurrency,
        semconv.ATTR_REPLAY_PROMPTS: prompts.record(), semconv.ATTR_REPLAY_REPEAT: 1})
    try:
        for scenario, kind, count in steps:
            attrs = {semconv.ATTR_REPLAY_RUN_ID: run_id, semconv.ATTR_REPLAY_SCENARIO: scenario,
                     semconv.ATTR_REPLAY_PROMPT: kind}
            # "short": a prompt really short (the replay's chat turn shares a long prefix)
            messages = (prompts.probe if kind == "short" else prompts.get(kind)).messages()
            if scenario is None:
                for _ in range(count):
                    client.warm(url, model, messages)
                continue
            for _ in range(count):
                with ThreadPoolExecutor(concurrency) as pool:
                    futures = [pool.submit(client.request, model, messages, lambda: url, attrs)
                               for _ in range(concurrency)]
                    results = [f.result() for f in futures]
                assert all(r.error is None for r in results), [r.error for r in results]
    finally:
        run.end()
        client.close()


def _wait_for(store_dir: Path, scenario_counts: dict[str, int], timeout_s: float = 60) -> None:
    from otel_ttft.tools.analysis.traces import load_spans

    deadline = time.monotonic() + timeout_s
    while True:
        spans = load_spans(store_dir)
        got = {}
        for s in spans:
            if s["name"] == semconv.SPAN_REQUEST:
                got[s["trace_id"]] = True
        clients = [s for s in spans if s["name"] == semconv.SPAN_REPLAY_REQUEST
                   and s["trace_id"] in got]
        if len(clients) >= sum(scenario_counts.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(clients)} answered replay requests arrived, want "
                                 f"{sum(scenario_counts.values())}")
        time.sleep(0.5)


def _analyze(store: Path, out: Path, *args: str) -> dict:
    assert cli.main(["analyze", str(store), "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def _verdict(doc: dict, scenario: str) -> dict:
    return next(v for v in doc["verdicts"] if v["scenario"] == scenario)


def _environment(receiver) -> tuple[dict, tuple]:
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "VLLM_CPU_CI_ENV": "1",
           # what users get: one span per request with its stage durations, children for a few
           env_names.OTEL_TTFT_REQUEST_DETAIL: semconv.DETAIL_AUTO}
    # Room for the six short ones of a burst at once (the server's default here is 4): the
    # baseline then has no wave waiting for a whole generation, and KV blocks alone hold back the
    # long ones.
    args = ("--num-gpu-blocks-override", str(KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN),
            "--no-enable-prefix-caching", "--max-num-seqs", "8")
    return env, args


@pytest.mark.acceptance
def test_verdicts_name_the_cause_the_test_made(receiver_process, tiny_model, tmp_path,
                                              capsys):
    """Not in ``make test``: in about one run of five to seven here, some requests of a run show
    their first content 40-60 ms after the server wrote the first chunk, as ``network``, and the
    verdicts on 10-70 ms differences drown in it. One cause is fixed: the tiny random model used
    to pick tokens that stream no text (6 % of its greedy picks), and the tiny models never do
    now (``tools/tiny_model.py``). The rest is the client's own process waiting for a CPU: on
    a 2-core machine vLLM's worker spins on its message queue between steps (a core's worth of
    CPU while requests run) and EngineCore and the API server take most of the other, so the
    client, woken by the first chunk, waits 30-40 ms for its turn. Measured with 300
    consecutive streamed requests through the replay client: the first chunk is on the socket
    when the server says (content in it; the first line to content 0.1 ms), yet reaches the
    client a median 30 ms later, and a 1 ms sleep in the client process wakes 30-40 ms late
    every 40 ms meanwhile (the GIL held 8 % of the time: not Python). The server at ``nice 10``
    cut the median to 5 ms, the tail (p99 43 ms) stayed: open."""
    receiver = receiver_process  # in a process of its own: the client below times chunks
    model = str(tiny_model)
    env, args = _environment(receiver)
    provider = make_tracer_provider(receiver.http_endpoint)
    tracer = provider.get_tracer("verdict-test")
    counter = tokenizer_counter(model)
    prompts = build_prompts(counter, MAX_MODEL_LEN, 8)
    with VllmServer(tiny_model, env=env, extra_args=args,
                    log_path=tmp_path / "server.log") as server:
        # The first request pays the compile; two more finish the activation's cold requests;
        # then the baseline and an identical workload interleaved (the machine's drift hits
        # both alike), then long prompts.
        _run(tracer, "sequential", 1, prompts, [
            ("first-request", "short", 1), (None, "short", 2),
            *[(name, "short", 1) for _ in range(8)
              for name in (semconv.SCENARIO_SHORT_PROMPT, "short-again")],
            (semconv.SCENARIO_LONG_PROMPT, "long", 4)], server.url, model)
        # One request with other client settings: a second run in the same store.
        _run(tracer, "other-settings", 1, build_prompts(counter, MAX_MODEL_LEN, 64), [
            ("short-other", "short", 1)], server.url, model, max_tokens=64)
        provider.force_flush()
        _wait_for(receiver.store.directory, {"all": 1 + 16 + 4 + 1})
    provider.shutdown()
    store = receiver.store.directory

    # Mixed client settings are refused, with the runs named.
    assert cli.main(["analyze", str(store)]) == 2
    assert "different client settings" in capsys.readouterr().err

    seq = _analyze(store, tmp_path / "seq.json", "--run", "sequential")
    for r in seq["requests"]:
        assert sum(r["stages"].values()) == pytest.approx(r["client_ttft_s"], rel=0.01)
    first = _verdict(seq, "first-request")
    assert (first["stage"], first["substage"], first["recommendation"]) == (
        "warmup", "warmup.compile", "persist-artifacts"), first
    # The first request's front end filled vLLM's logits-processor plugin cache (an entry-point
    # scan): warm-up work, carved out of its front end, seen nowhere after.
    by_scenario = {}
    for r in seq["requests"]:
        by_scenario.setdefault(r["scenario"], []).append(r)
    (first_record,) = by_scenario["first-request"]
    assert first_record["substages"].get(semconv.STAGE_WARMUP_FIRST_USE, 0) > 0, first_record
    assert all(semconv.STAGE_WARMUP_FIRST_USE not in r["substages"]
               for r in by_scenario[semconv.SCENARIO_SHORT_PROMPT])
    from otel_ttft.tools.analysis.traces import load_spans

    spans = load_spans(store)
    fills = [s for s in spans if s["name"] == semconv.SPAN_FIRST_USE
             and s["trace_id"] == first_record["trace_id"]]
    assert fills, "no Front-end first use span in the first request"
    by_id = {s["span_id"]: s for s in spans}
    for fill in fills:
        parent = by_id[fill["parent_span_id"]]
        assert parent["name"] == semconv.SPAN_REQUEST_INPUT
        assert parent["start_ns"] <= fill["start_ns"] <= fill["end_ns"] <= parent["end_ns"]
        assert fill["attributes"][semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_FIRST_USE
    assert {f["attributes"][semconv.ATTR_FIRST_USE_CACHE] for f in fills} >= {
        "logits-processor plugins (entry-point scan)"}
    # The same workload as the baseline, interleaved with it: no slower beyond noise.
    again = _verdict(seq, "short-again")
    assert (again["outcome"], again["stage"], again["recommendation"]) == (
        "within-noise", "none", "none"), again
    assert "not warm" not in again["evidence"].get("note", "")
    long = _verdict(seq, semconv.SCENARIO_LONG_PROMPT)
    assert (long["stage"], long["recommendation"]) == ("prefill", "tune-context"), long
    assert "only correlated" in long["evidence"]["note"]


@pytest.mark.acceptance
def test_burst_verdict_names_the_queue(receiver_process, tiny_model, tmp_path):
    """Six long prompts against a KV cache that holds one: they wait in vLLM's queue, against
    six short ones that all run at once. Not in ``make test``: on the 2-core machines here the
    short baseline's client TTFT sometimes carries a wait of whole generations (0.6-2.3 s, in
    about one run of four) that happens before vLLM's arrival time, though the client sent at
    once and nothing was running or waiting in the engine when the request arrived; the
    analysis then rightly calls the queue's +1.5 s within the noise. Not found yet: not the
    receiver (a process of its own here), nor the client's garbage collection (frozen), nor the
    server's concurrency limit (8)."""
    receiver = receiver_process
    model = str(tiny_model)
    env, args = _environment(receiver)
    provider = make_tracer_provider(receiver.http_endpoint)
    tracer = provider.get_tracer("verdict-test")
    counter = tokenizer_counter(model)
    with VllmServer(tiny_model, env=env, extra_args=args,
                    log_path=tmp_path / "server.log") as server:
        _run(tracer, "warm", 1, build_prompts(counter, MAX_MODEL_LEN, 64),
             [(None, "short", 3)], server.url, model, max_tokens=64)
        # 64 tokens each: a long request holds 16 of the 17 blocks for its whole generation, so
        # the others wait in the queue; six short ones (one block each) all fit at once.
        _run(tracer, "burst", 6, build_prompts(counter, MAX_MODEL_LEN, 64), [
            ("short-burst", "short", 2), ("tiny-kv-burst", "long", 1)], server.url, model,
            max_tokens=64)
        provider.force_flush()
        _wait_for(receiver.store.directory, {"all": 12 + 6})
    provider.shutdown()
    burst = _analyze(receiver.store.directory, tmp_path / "burst.json", "--run", "burst",
                     "--baseline", "short-burst")
    blocked = _verdict(burst, "tiny-kv-burst")
    assert (blocked["stage"], blocked["recommendation"]) == ("queue", "tune-admission"), blocked
