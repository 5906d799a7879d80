"""Per-request cost of the request-path hooks, measured on vLLM's real classes in one process.

A real ``Scheduler`` (EngineCore side) and a real ``OutputProcessor`` with the tiny model's
tokenizer (API side) run a fixed batch of requests to completion, the model replaced by "sample
one token per finished prefill". The same batch runs three ways, interleaved: plain vLLM; request
hooks that capture but emit nothing; hooks plus spans and metrics. The difference in time spent
inside each side (fastest round of each mode: noise on a shared machine only adds), divided by
the number of requests (or of scheduled request-steps), is our cost. Spans and metrics go through
an SDK provider with a discarding exporter (the export thread's protobuf encoding is not counted
here; the end-to-end A/B benchmark counts everything). ``AsyncLLM.generate``'s pass-through is
timed separately over a stand-in async generator.

Usage: python benchmarks/request_microbench.py [--requests 128] [--tokens 16] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from dataclasses import dataclass

import torch
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_ttft.hooks import request
from otel_ttft.hooks.registry import HookSet
from otel_ttft.hooks.request import api as request_api
from otel_ttft.tiny_model import ensure_tiny_model


class _NullSpans(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


class _NullMetrics(MetricExporter):
    def __init__(self):
        super().__init__()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def install_providers() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_NullSpans()))  # SDK defaults
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(_NullMetrics(), export_interval_millis=1000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


@dataclass
class Timing:
    engine_s: float = 0.0  # Scheduler.add_request + schedule + update_from_output
    api_s: float = 0.0  # OutputProcessor.add_request + process_outputs (+ our span building)
    request_steps: int = 0  # scheduled (request, step) pairs


def build(model_dir: str):
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.tokenizers.registry import get_tokenizer
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_dir, max_model_len=512, dtype="float32")
    cache_config = CacheConfig(block_size=32, enable_prefix_caching=False)
    cache_config.num_gpu_blocks = 4096
    sched_config = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048,
                                   max_model_len=512, is_encoder_decoder=False)
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=sched_config)
    spec = FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=32, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=4096, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    tokenizer = get_tokenizer(model_dir)

    def fresh():
        scheduler = Scheduler(vllm_config, kv_config, StructuredOutputManager(vllm_config),
                              block_size=32, log_stats=True)
        processor = OutputProcessor(tokenizer, log_stats=True, stream_interval=1,
                                    tracing_enabled=False)
        return scheduler, processor

    return fresh


def run_batch(fresh, n_requests: int, n_tokens: int, seed: int) -> Timing:
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import RequestOutputCollector
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    scheduler, processor = fresh()
    timing = Timing()
    params = SamplingParams(max_tokens=n_tokens, min_tokens=n_tokens, ignore_eos=True,
                            temperature=0, output_kind=RequestOutputKind.DELTA)
    queues = []
    for i in range(n_requests):
        rid = f"r{seed}-{i}"
        prompt = [(seed * 7919 + i * 31 + j) % 2000 + 10 for j in range(32 + (i % 4) * 64)]
        core_req = EngineCoreRequest(
            request_id=rid, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
            pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None, external_req_id=rid)
        queue = RequestOutputCollector(RequestOutputKind.DELTA, rid)
        queues.append(queue)
        t0 = time.perf_counter()
        processor.add_request(core_req, None, None, 0, queue)
        t1 = time.perf_counter()
        scheduler.add_request(Request.from_engine_core_request(core_req, None))
        t2 = time.perf_counter()
        timing.api_s += t1 - t0
        timing.engine_s += t2 - t1
    step = 0
    while scheduler.has_requests():
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        ids = list(out.num_scheduled_tokens)
        timing.request_steps += len(ids)
        reqs = scheduler.requests
        sampled = [[(step + k) % 2000 + 10] if reqs[r].num_computed_tokens >= reqs[r].num_tokens
                   else [] for k, r in enumerate(ids)]
        runner_out = ModelRunnerOutput(req_ids=ids,
                                       req_id_to_index={r: k for k, r in enumerate(ids)},
                                       sampled_token_ids=sampled)
        t2 = time.perf_counter()
        engine_outputs = scheduler.update_from_output(out, runner_out)
        t3 = time.perf_counter()
        timing.engine_s += (t1 - t0) + (t3 - t2)
        for eco in engine_outputs.values():
            t4 = time.perf_counter()
            processor.process_outputs(eco.outputs, eco.timestamp, IterationStats())
            timing.api_s += time.perf_counter() - t4
        for q in queues:
            q.get_nowait()
        step += 1
    # Stand in for AsyncLLM.generate's end: the generate pass-through closes its records.
    t0 = time.perf_counter()
    for rec in list(request_api.live.values()):
        request_api.request_spans.emit_request(rec, time.monotonic())
    request_api.live.clear()
    timing.api_s += time.perf_counter() - t0
    return timing


async def _passthrough(n_outputs: int, traced: bool, rounds: int) -> float:
    """Seconds per request added by the generate pass-through (records emitted elsewhere)."""
    from otel_ttft.hooks.registry import _pass_through
    from otel_ttft.hooks.request.state import Handle

    (generate_hook,) = [h for h in request.HOOKS if h.name == "request.generate"]

    class Out:
        finished = False

    outs = [Out() for _ in range(n_outputs - 1)]
    last = Out()
    last.finished = True
    last.outputs = []
    outs.append(last)

    async def inner():
        for o in outs:
            yield o

    t0 = time.perf_counter()
    for _ in range(rounds):
        gen = (_pass_through(generate_hook, inner(),
                             request_api.Generate(Handle(None, None, "m", True)))
               if traced else inner())
        async for _ in gen:
            pass
    return (time.perf_counter() - t0) / rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    install_providers()
    fresh = build(str(ensure_tiny_model()))
    hooks = HookSet(list(request.HOOKS))
    run_batch(fresh, args.requests, args.tokens, seed=0)  # warm both paths' caches
    hooks.apply()
    run_batch(fresh, args.requests, args.tokens, seed=1)
    hooks.remove()

    # plain vLLM / hooks that capture but emit nothing / hooks + spans + metrics
    runs: dict[str, list[Timing]] = {"plain": [], "capture": [], "full": []}
    emit = request_api.request_spans.emit_request
    for r in range(args.rounds):
        order = ["plain", "capture", "full"]
        for mode in (order if r % 2 == 0 else order[::-1]):
            if mode != "plain":
                hooks.apply()
            if mode == "capture":
                request_api.request_spans.emit_request = lambda rec, now: None
            gc.collect()
            runs[mode].append(run_batch(fresh, args.requests, args.tokens, seed=10 + r))
            request_api.request_spans.emit_request = emit
            if mode != "plain":
                hooks.remove()

    def med(mode: str, field: str) -> float:
        """Fastest round: the noise on a shared 2-core machine only ever adds time."""
        return min(getattr(t, field) for t in runs[mode])

    n = args.requests
    api_us = med("full", "api_s") - med("plain", "api_s")
    capture_us = med("capture", "api_s") - med("plain", "api_s")
    eng_us = med("full", "engine_s") - med("plain", "engine_s")
    steps = med("full", "request_steps")
    pt = asyncio.run(_passthrough(args.tokens, True, 2000)) - \
        asyncio.run(_passthrough(args.tokens, False, 2000))
    figures = {
        "requests": n, "output_tokens": args.tokens, "rounds": args.rounds,
        "api_us_per_request_capture": capture_us / n * 1e6 + pt * 1e6,
        "api_us_per_request_spans_and_metrics": (api_us - capture_us) / n * 1e6,
        "api_us_per_request_total": api_us / n * 1e6 + pt * 1e6,
        "api_us_per_request_generate_passthrough": pt * 1e6,
        "api_us_per_request_plain_vllm": med("plain", "api_s") / n * 1e6,
        "engine_us_per_request": eng_us / n * 1e6,
        "engine_us_per_scheduled_request_step": eng_us / steps * 1e6,
        "engine_us_per_request_plain_vllm": med("plain", "engine_s") / n * 1e6,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
