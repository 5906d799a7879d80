"""Per-request cost of the request path, measured on vLLM's real classes in one process.

A real ``Scheduler`` (EngineCore side) and a real ``OutputProcessor`` with the tiny model's
tokenizer (API side) run a fixed batch of requests to completion, the model replaced by "sample
one token per finished prefill". The same batch runs three ways, interleaved: plain vLLM; request
hooks that capture but emit nothing; hooks plus spans and metrics. The difference in time spent
inside each side (fastest round of each mode: noise on a shared machine only adds), divided by
the number of requests (or of scheduled request-steps), is our cost.

All-in: spans and metrics go through SDK providers as ``opentelemetry-instrument`` sets them up
(batch span processor), and the spans each full round produced are then encoded as the OTLP
exporter does (``encode_spans(...).SerializeToString()``), timed and counted; so is one metrics
export per round (charged to that round's requests only: a real 60 s interval spreads it over
far more). Not counted here: the HTTP send (the end-to-end benchmark counts everything).
``AsyncLLM.generate``'s hook is timed over a stand-in async generator, through the same registry
as in vLLM. Two output lengths (``--tokens 16,256``) split the cost into per request and per
streamed output.

Usage: python benchmarks/request_microbench.py [--requests 128] [--tokens 16,256] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from dataclasses import dataclass, replace

import torch
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from otel_ttft.hooks import request
from otel_ttft.hooks.registry import HookSet
from otel_ttft.hooks.request import api as request_api
from otel_ttft.tiny_model import ensure_tiny_model


class _Collect(SpanExporter):
    """Keeps what the batch processor hands over, for encoding outside the timed request path."""

    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


SPANS = _Collect()
READER = InMemoryMetricReader()


def install_providers() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(SPANS))  # SDK defaults
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    return provider


def encode_round(provider: TracerProvider) -> tuple[float, int, int]:
    """Seconds to OTLP-encode what this round exported (spans, one metrics collection), and
    how many spans and bytes that was."""
    provider.force_flush()
    spans, SPANS.spans = SPANS.spans, []
    data = READER.get_metrics_data()
    t0 = time.perf_counter()
    size = len(encode_spans(spans).SerializeToString()) if spans else 0
    if data is not None:
        size += len(encode_metrics(data).SerializeToString())
    return time.perf_counter() - t0, len(spans), size


@dataclass
class Timing:
    engine_s: float = 0.0  # Scheduler.add_request + schedule + update_from_output
    api_s: float = 0.0  # OutputProcessor.add_request + process_outputs (+ our span building)
    request_steps: int = 0  # scheduled (request, step) pairs
    encode_s: float = 0.0  # OTLP encoding of the round's spans and one metrics export
    spans: int = 0
    otlp_bytes: int = 0


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


class _StandIn:
    """Stands in for ``AsyncLLM``: ``generate`` yields ready outputs, so only the hook's
    per-request and per-output work differs between the two timings."""

    model_config = None

    def __init__(self, outs: list) -> None:
        self.outs = outs

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        for o in self.outs:
            yield o


async def _passthrough(n_outputs: int, rounds: int) -> float:
    """Seconds per request added by the ``request.generate`` hook, applied through the registry
    as in vLLM, to a stand-in generator (the records themselves are emitted elsewhere)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    class Choice:
        index, text, finish_reason = 0, "x", None

    class Out:
        finished = False
        outputs = [Choice()]

    outs = [Out() for _ in range(n_outputs)]
    outs[-1] = type("Last", (Out,), {"finished": True})()
    params = SamplingParams(max_tokens=n_outputs, output_kind=RequestOutputKind.DELTA)
    hook = next(h for h in request.HOOKS if h.name == "request.generate")
    stand_in = _StandIn(outs)

    async def timed() -> float:
        t0 = time.perf_counter()
        for i in range(rounds):
            async for _ in stand_in.generate("p", params, f"s{i}"):
                pass
        return time.perf_counter() - t0

    plain = []
    hooked = []
    for _ in range(3):
        plain.append(await timed())
        hooks = HookSet([replace(hook, target=f"{__name__}:_StandIn.generate", applied=False)])
        hooks.apply()
        hooked.append(await timed())
        hooks.remove()
    return (min(hooked) - min(plain)) / rounds


def measure(fresh, provider: TracerProvider, hooks: HookSet, n: int, tokens: int,
            rounds: int) -> dict:
    """plain vLLM / hooks that capture but emit nothing / hooks + spans + metrics + encoding."""
    runs: dict[str, list[Timing]] = {"plain": [], "capture": [], "full": []}
    emit = request_api.request_spans.emit_request
    for r in range(rounds):
        order = ["plain", "capture", "full"]
        for mode in (order if r % 2 == 0 else order[::-1]):
            if mode != "plain":
                hooks.apply()
            if mode == "capture":
                request_api.request_spans.emit_request = lambda rec, now: None
            encode_round(provider)  # start from an empty batch
            gc.collect()
            timing = run_batch(fresh, n, tokens, seed=10 + r)
            timing.encode_s, timing.spans, timing.otlp_bytes = encode_round(provider)
            runs[mode].append(timing)
            request_api.request_spans.emit_request = emit
            if mode != "plain":
                hooks.remove()

    def best(mode: str, field: str) -> float:
        """Fastest round: the noise on a shared 2-core machine only ever adds time."""
        return min(getattr(t, field) for t in runs[mode])

    api = best("full", "api_s") - best("plain", "api_s")
    capture = best("capture", "api_s") - best("plain", "api_s")
    encode = best("full", "encode_s")
    eng = best("full", "engine_s") - best("plain", "engine_s")
    steps = best("full", "request_steps")
    pt = asyncio.run(_passthrough(tokens, 2000))
    full = runs["full"][-1]
    return {
        "output_tokens": tokens,
        "api_us_per_request_hooks": (capture + pt * n) / n * 1e6,
        "api_us_per_request_generate_hook": pt * 1e6,
        "api_us_per_request_spans_and_metrics": (api - capture) / n * 1e6,
        "api_us_per_request_otlp_encoding": encode / n * 1e6,
        "api_us_per_request_all_in": (api + pt * n + encode) / n * 1e6,
        "api_us_per_request_plain_vllm": best("plain", "api_s") / n * 1e6,
        "api_all_in_ratio": (best("plain", "api_s") + api + pt * n + encode)
        / best("plain", "api_s"),
        "spans_per_request": full.spans / n,
        "otlp_bytes_per_request": full.otlp_bytes / n,
        "engine_us_per_request": eng / n * 1e6,
        "engine_us_per_scheduled_request_step": eng / steps * 1e6,
        "engine_us_per_request_plain_vllm": best("plain", "engine_s") / n * 1e6,
        "engine_ratio": best("full", "engine_s") / best("plain", "engine_s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", default="16,256", help="output lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    provider = install_providers()
    fresh = build(str(ensure_tiny_model()))
    hooks = HookSet(list(request.HOOKS))
    run_batch(fresh, args.requests, 16, seed=0)  # warm both paths' caches
    hooks.apply()
    run_batch(fresh, args.requests, 16, seed=1)
    hooks.remove()
    lengths = [int(t) for t in args.tokens.split(",")]
    results = [measure(fresh, provider, hooks, args.requests, t, args.rounds) for t in lengths]
    figures: dict = {"requests": args.requests, "rounds": args.rounds, "by_length": results}
    if len(results) >= 2:  # all-in = per request + per output x output tokens
        a, b = results[0], results[-1]
        per_out = ((b["api_us_per_request_all_in"] - a["api_us_per_request_all_in"])
                   / (b["output_tokens"] - a["output_tokens"]))
        figures["api_us_per_streamed_output"] = per_out
        figures["api_us_per_request_fixed"] = (a["api_us_per_request_all_in"]
                                               - per_out * a["output_tokens"])
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
