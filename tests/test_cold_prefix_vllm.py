"""A restart as production traffic meets it (issue 56), on real vLLM (CPU build, tiny Llama, a
2,048-token context, vLLM's default prefix caching), request spans over real OTLP into the
project's receiver, no replay: the spans carry no replay labels.

- Chat turns sharing a long system prompt and history (about 1,200 tokens: nine of vLLM-CPU's
  128-token blocks), a restart with the same caches and history, the same turns again: the
  first requests after the restart carry ``prefill.uncached_prefix`` on their own spans, the
  live verdict after the cold requests names the cold prefix cache with the warm-up (prefixes
  counted, never quoted), and ``analyze`` on the store (first-after-activation against warm)
  names it too, never ``tune-context``.
- The control: prompts that share no prefix, a restart whose compile cache was emptied and
  whose checkpoint was evicted from the page cache and read slowly (a delay planted in vLLM's
  safetensors iterator): nothing claims a cold prefix cache; the verdict at ready says the
  compile cache was empty and names a concrete command or option for the read.

Asserts are on what was measured (tokens, sub-stages, verdict fields), never on seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import prefix_memory
from otel_ttft.tools import cli
from otel_ttft.tools.replay import evict
from otel_ttft.tools.replay.prompts import SYSTEM_TEXT, build_prompts, tokenizer_counter
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.vllm_args import EAGER_ARGS
from tests.vllm_plants import plugin_dir

pytestmark = pytest.mark.vllm

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX
COLD = 3
CONTEXT = ("--max-model-len", "2048", "--max-num-seqs", "4")


def _chat(server: VllmServer, model: str, messages: list[dict]) -> None:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": 2,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200


def _env(receiver, **extra: str) -> dict:
    # every request gets its span (children as by default): the warm ones are the baseline
    return {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
            "OTEL_TTFT_COLD_REQUESTS": str(COLD),
            "OTEL_TTFT_REQUEST_DETAIL": semconv.DETAIL_SPANS, **extra}


def _verdicts(receiver, seen: set[str], timeout: float = 120) -> tuple[dict, dict]:
    """The next activation's two verdict spans (ready, cold requests)."""
    def judged(spans):
        by_trace: dict[str, dict] = {}
        for s in spans:
            if s["name"] == semconv.SPAN_ACTIVATION_VERDICT and s["trace_id"] not in seen:
                by_trace.setdefault(s["trace_id"], {})[
                    s["attributes"].get(semconv.ATTR_VERDICT_PHASE)] = s
        return [v for v in by_trace.values() if set(v) == set(semconv.VERDICT_PHASES)]
    (both,) = judged(receiver.wait_for_spans(judged, timeout))
    ready, cold = (both[p] for p in semconv.VERDICT_PHASES)
    seen.add(ready["trace_id"])
    return ready, cold


def _requests_of(receiver, activation_trace: str) -> list[dict]:
    """The request spans linked to one activation, in arrival order."""
    out = [s for s in receiver.store.spans() if s["name"] == semconv.SPAN_REQUEST
           and any(lk.get("trace_id") == activation_trace for lk in s.get("links") or [])]
    return sorted(out, key=lambda s: s["start_ns"])


def _uncached_children(receiver, request: dict) -> list[dict]:
    return [s for s in receiver.store.spans() if s["trace_id"] == request["trace_id"]
            and s["name"] == semconv.SPAN_PREFILL_UNCACHED_PREFIX]


def _serve(model, env, args, log, traffic):
    with VllmServer(model, env=env, extra_args=args, log_path=log) as server:
        return traffic(server)


def test_a_restart_names_the_cold_prefix_cache_with_the_warm_up(receiver, tiny_model, tmp_path):
    model = str(tiny_model)
    prompts = build_prompts(tokenizer_counter(model), 2048, 4)
    chat = prompts.short  # a shared system prompt and history, then a numbered question
    assert chat.shared_tokens > 1024
    history = tmp_path / "cache" / "activations.json"
    env = _env(receiver, OTEL_TTFT_VERDICT_HISTORY=str(history))
    args = (*EAGER_ARGS, *CONTEXT)
    seen: set[str] = set()

    def warm_traffic(server):  # the cold window, then warm chat turns (one in 8 sampled)
        for n in range(COLD + 24):
            _chat(server, model, chat.messages(n))
        _verdicts(receiver, seen)

    _serve(tiny_model, env, args, tmp_path / "first.log", warm_traffic)
    table = json.loads(prefix_memory.path_beside(history).read_text())
    (entry,) = table["models"].values()
    assert entry["blocks"] and entry["cached_tokens"] > entry["prompt_tokens"] / 2, entry
    assert SYSTEM_TEXT[:40] not in json.dumps(table)  # hashes and counts, never text

    def after_restart(server):  # the same turns after a restart: the cold window at once
        with ThreadPoolExecutor(COLD) as pool:
            list(pool.map(lambda n: _chat(server, model, chat.messages(100 + n)), range(COLD)))
        for n in range(6):
            _chat(server, model, chat.messages(200 + n))

    _serve(tiny_model, env, args, tmp_path / "second.log", after_restart)
    ready, cold = _verdicts(receiver, seen)
    first_requests = _requests_of(receiver, ready["trace_id"])[:COLD]
    paid = [r for r in first_requests
            if r["attributes"].get(semconv.ATTR_REQUEST_UNCACHED_PREFIX_TOKENS)]
    assert paid, [r["attributes"] for r in first_requests]
    for r in paid:
        a = r["attributes"]
        assert a[semconv.ATTR_REQUEST_UNCACHED_PREFIX_TOKENS] >= 1024
        assert a[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] < 128
        (child,) = _uncached_children(receiver, r)
        assert child["attributes"][semconv.ATTR_STAGE] == UNCACHED
    # no request of the first start had a baseline to be measured against
    first_start = sorted(seen - {ready["trace_id"]})
    assert not any(_uncached_children(receiver, r)
                   for r in _requests_of(receiver, first_start[0]))

    a = cold["attributes"]
    assert (a[semconv.ATTR_VERDICT_OUTCOME], a[semconv.ATTR_VERDICT_SUBSTAGE],
            a[semconv.ATTR_VERDICT_RECOMMENDATION]) == ("expanded", UNCACHED, "warm-up"), a
    assert a[semconv.ATTR_VERDICT_COLD_UNCACHED_PREFIX_TOKENS] >= 1024
    summary = a[semconv.ATTR_VERDICT_SUMMARY]
    assert "cold prefix cache" in summary and "POST /v1/chat/completions" in summary, summary
    assert "shared prefix" in summary and SYSTEM_TEXT[:40] not in summary
    assert "cold prefix cache" in (tmp_path / "second.log").read_text(errors="replace")

    out = tmp_path / "analysis.json"
    assert cli.main(["analyze", str(receiver.store.directory), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (v,) = [v for v in doc["verdicts"] if v["scenario"].endswith(":first")]
    grew = {c["stage"]: c for c in v.get("chain") or []}
    assert v["recommendation"] != "tune-context" and grew.get("prefill", {}).get(
        "recommendation", "warm-up") != "tune-context", v
    assert UNCACHED in (v["substage"], *(c.get("substage") for c in v.get("chain") or [])), v
    assert "tune-context" not in v["summary"], v["summary"]


def test_control_no_shared_prefix_emptied_compile_cache_and_slow_cold_read(
        receiver, tiny_model, tmp_path):
    """Compiled (not eager), with a cache root of its own: the first start fills it; before the
    second the cache is emptied and the checkpoint evicted, its read slowed."""
    model_dir = evict.private_copy(tiny_model, tmp_path / "models")
    model = str(model_dir)
    long = build_prompts(tokenizer_counter(model), 2048, 4).long  # numbered first: no sharing
    root = tmp_path / "vllm-cache"
    # the history where it goes by default: beside vLLM's cache (the session's setting off)
    env = _env(receiver, VLLM_CACHE_ROOT=str(root), OTEL_TTFT_VERDICT_HISTORY="")
    args = ("--dtype", "float32", *CONTEXT)
    seen: set[str] = set()

    def traffic(offset):
        def run(server):
            for n in range(COLD + 8):
                _chat(server, model, long.messages(offset + n))
            return _verdicts(receiver, seen, 300)
        return run

    _serve(model_dir, env, args, tmp_path / "first.log", traffic(0))
    assert (root / "otel-ttft" / "activations.json").exists()  # the default, beside vLLM's
    shutil.rmtree(root / "torch_compile_cache")
    evict.evict(model_dir)
    plant = plugin_dir(tmp_path, "read")
    slow = {"PYTHONPATH": os.pathsep.join(filter(None, [str(plant),
                                                        os.environ.get("PYTHONPATH")])),
            "TTFT_TEST_FACTOR": "3"}  # 3 x the worker's age: well past the alert's 10 s
    ready, cold = _serve(model_dir, {**env, **slow}, args, tmp_path / "second.log",
                         traffic(1000))

    a = ready["attributes"]
    summary = a[semconv.ATTR_VERDICT_SUMMARY]
    assert (a[semconv.ATTR_VERDICT_OUTCOME], a[semconv.ATTR_VERDICT_SUBSTAGE]) == (
        "expanded", semconv.STAGE_LOAD_READ), summary
    change = list(a.get(semconv.ATTR_VERDICT_CHANGE) or [])
    shards = [str(f) for f in evict.checkpoint_files(model_dir)]
    # the exact files to read into the page cache, or the installed vLLM's own read option
    assert ("vmtouch -t " in summary and all(f in summary for f in shards)) \
        or "--safetensors-load-strategy" in change, summary
    assert "--safetensors-load-strategy prefetch" in summary, summary
    assert "was empty when this start began" in summary, summary
    for verdict in (ready, cold):  # the control: no prefix was shared, none is claimed
        s = verdict["attributes"][semconv.ATTR_VERDICT_SUMMARY]
        assert "prefix cache" not in s and UNCACHED not in s, s  # (the test's path says prefix)
    for trace in seen:
        for r in _requests_of(receiver, trace):
            assert not r["attributes"].get(semconv.ATTR_REQUEST_UNCACHED_PREFIX_TOKENS)
            assert not _uncached_children(receiver, r)
    out = tmp_path / "analysis.json"
    assert cli.main(["analyze", str(receiver.store.directory), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert not any(UNCACHED in r["substages"] for r in doc["requests"])
