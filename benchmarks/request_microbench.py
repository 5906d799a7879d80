"""Per-request cost of the request path, measured on vLLM's real classes in one process.

A real ``Scheduler`` and vLLM's ``MultiprocExecutor.execute_model``/``sample_tokens`` over a
stand-in ``collective_rpc`` (EngineCore side) and a real ``OutputProcessor`` with the tiny model's
tokenizer (API side) run a fixed batch of requests to completion, the model replaced by "sample
one token per finished prefill", with and without our hooks (interleaved rounds).

Our cost is measured directly, not as a difference of two noisy totals: each hook wrapper's own
time (its time minus the vLLM call inside, the timer's cost subtracted, the registry's guard per
call added), the HTTP-side hooks over stand-ins with starlette's and vLLM's signatures, and the
OTLP encoding of the round's spans (what the exporter does in the API process's export thread;
one metrics export's encoding is reported apart: paid once per export interval). Spans and
metrics go through the providers our configurator builds for ``opentelemetry-instrument``.
``--traced``: every request has a sampled ``traceparent`` (every span is built). Not counted: the
HTTP send, the export's network write (``paired_overhead.py`` counts everything), the
``generate`` hook (content capture only). Plain vLLM's time on the same code paths is the
denominator. ``--tokens 16,256`` splits the cost into per request and per streamed output.
Timers read this thread's CPU time; the fastest round of each is kept (noise only adds).

``--in-flight N`` keeps at most N requests in the engine, a new one admitted as one ends (the
closed loop cN: at 1, per-step costs count per token); by default all are admitted at once.
``--caches cold`` (default) evicts the CPU caches before each half of every engine step, as the
rest of a busy server does between two of our calls; ``warm``: back to back. There is no event
loop here: a finished request is emitted as it ends, where the server batches them a second
later (``settle.EMIT_DELAY_S``); the work per request is the same.

Usage: python benchmarks/request_microbench.py [--requests 128] [--tokens 16,256] [--rounds 9]
       [--in-flight N] [--traced] [--caches cold|warm] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from hook_meter import Meter, guard_overhead
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ttft.runtime import config, configurator
from otel_ttft.runtime.hooks import all_parts, request, rpc
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.hooks.request import state as request_state
from otel_ttft.runtime.instrumentor import disabled_hooks
from otel_ttft.runtime.state import ProcessState
from otel_ttft.tools.tiny_model import ensure_tiny_model

# This thread's CPU time, not wall time: on a shared machine, time spent descheduled is not ours.
_clock = time.thread_time


class _Collect(SpanExporter):
    """Keeps what the batch processor hands over, for encoding outside the timed request path."""

    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


SPANS = _Collect()
READER = InMemoryMetricReader()


def install_providers():
    """Our configurator's providers around the collector and an in-memory reader, global."""
    built = configurator.build({}, span_exporters=[SPANS], metric_readers=[READER])
    trace.set_tracer_provider(built.tracer_provider)
    metrics.set_meter_provider(built.meter_provider)
    return built.tracer_provider


def encode_round(provider) -> tuple[float, float, int, int]:
    """Seconds to OTLP-encode this round's spans (the exporter's work) and one metrics
    collection (a per-export cost, whatever the number of requests); spans and OTLP bytes."""
    provider.force_flush()
    spans, SPANS.spans = SPANS.spans, []
    data = READER.get_metrics_data()
    span_s = metric_s = float("inf")
    size = 0
    for _ in range(3):  # deterministic work: the fastest of three drops the machine's noise
        t0 = _clock()
        size = len(encode_spans(spans).SerializeToString()) if spans else 0
        t1 = _clock()
        if data is not None:
            encode_metrics(data).SerializeToString()
        span_s, metric_s = min(span_s, t1 - t0), min(metric_s, _clock() - t1)
    return span_s, metric_s, len(spans), size


@dataclass
class Timing:
    engine_s: float = 0.0  # Scheduler.add_request + schedule + update_from_output
    api_s: float = 0.0  # OutputProcessor.add_request + process_outputs (+ our span building)
    request_steps: int = 0  # scheduled (request, step) pairs
    close_s: float = 0.0  # records still open at the end, closed as a disconnect would


def build(model_dir: str, n_requests: int):
    """All requests admitted at once (their prefills in the first steps), so that TTFT does not
    grow with the output length and the detail policy sees the same requests at every length."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.tokenizers.registry import get_tokenizer
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_dir, max_model_len=512, dtype="float32")
    cache_config = CacheConfig(block_size=32, enable_prefix_caching=False)
    cache_config.num_gpu_blocks = 4096
    sched_config = SchedulerConfig(max_num_seqs=n_requests, max_num_batched_tokens=4096,
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
        return scheduler, processor, _Executor()

    return fresh


class _Executor:
    """vLLM's ``MultiprocExecutor.execute_model`` and ``sample_tokens``, EngineCore's two RPCs per
    step, over a ``collective_rpc`` that hands back the step's model output instead of
    broadcasting to a worker process: our ``rpc.parent_context`` hook wraps it as it wraps
    vLLM's (its own time is EngineCore's)."""

    def __init__(self) -> None:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        type(self).execute_model = vars(MultiprocExecutor)["execute_model"]
        type(self).sample_tokens = vars(MultiprocExecutor)["sample_tokens"]
        self.output_rank = 0
        self.kv_output_aggregator = self.ec_output_aggregator = None
        self.output = None

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, **options):
        return self.output if method == "sample_tokens" else None


TRACED = False  # --traced: every request arrives with a sampled traceparent
STATE: ProcessState  # this process's state, as ``_instrument`` builds it (one for every round)
IN_FLIGHT = 0  # --in-flight N: at most N requests in the engine at once (0: all admitted at once)


class _Evictor:
    """What the rest of a busy server does to the CPU caches between two engine steps (the HTTP
    stack, event loop and ZMQ; the worker next door): one byte written per cache line over
    twice the L2 size and over many pages (the TLB)."""

    def __init__(self, size: int = 16 << 20):
        import numpy as np

        self.buf = np.zeros(size, dtype=np.uint8)

    def __call__(self) -> None:
        self.buf[::64] += 1


evict = None  # set in main (--caches cold)


class YoungObjects:
    """Tracked objects a run leaves alive long enough to count towards the next collection
    (collections times the threshold, plus the count left): each brings one closer."""

    def __init__(self) -> None:
        self.objects = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.objects += gc.get_threshold()[0]

    def __enter__(self) -> YoungObjects:
        gc.collect()
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)
        self.objects += gc.get_count()[0]


def run_batch(fresh, n_requests: int, n_tokens: int, seed: int) -> Timing:
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import RequestOutputCollector
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    scheduler, processor, executor = fresh()
    timing = Timing()
    params = SamplingParams(max_tokens=n_tokens, min_tokens=n_tokens, ignore_eos=True,
                            temperature=0, output_kind=RequestOutputKind.DELTA)
    queues = []
    core_reqs = []
    for i in range(n_requests):
        rid = f"r{seed}-{i}"
        prompt = [(seed * 7919 + i * 31 + j) % 2000 + 10 for j in range(32 + (i % 4) * 64)]
        core_reqs.append(EngineCoreRequest(
            request_id=rid, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
            pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None, external_req_id=rid,
            trace_headers={"traceparent": f"00-{random.getrandbits(128):032x}-"
                                          f"{random.getrandbits(64):016x}-01"} if TRACED else None))

    def admit(core_req) -> None:
        core_req.arrival_time = time.time()  # admitted now (a closed loop's next request)
        queue = RequestOutputCollector(RequestOutputKind.DELTA, core_req.request_id)
        queues.append(queue)
        if evict is not None:  # each request's HTTP handling ran before its add_request
            evict()
        t0 = _clock()
        processor.add_request(core_req, None, None, 0, queue)
        t1 = _clock()
        scheduler.add_request(Request.from_engine_core_request(core_req, None))
        t2 = _clock()
        timing.api_s += t1 - t0
        timing.engine_s += t2 - t1

    limit = IN_FLIGHT or n_requests
    waiting = list(reversed(core_reqs))
    while waiting and len(scheduler.requests) < limit:
        admit(waiting.pop())
    step = 0
    while scheduler.has_requests():
        if evict is not None:
            evict()
        t0 = _clock()
        out = scheduler.schedule()
        t1 = _clock()
        ids = list(out.num_scheduled_tokens)
        timing.request_steps += len(ids)
        reqs = scheduler.requests
        sampled = [[(step + k) % 2000 + 10] if reqs[r].num_computed_tokens >= reqs[r].num_tokens
                   else [] for k, r in enumerate(ids)]
        executor.output = ModelRunnerOutput(req_ids=ids,
                                            req_id_to_index={r: k for k, r in enumerate(ids)},
                                            sampled_token_ids=sampled)
        t2 = _clock()
        executor.execute_model(out, non_block=False)
        runner_out = executor.sample_tokens(None)
        engine_outputs = scheduler.update_from_output(out, runner_out)
        t3 = _clock()
        timing.engine_s += (t1 - t0) + (t3 - t2)
        if evict is not None:
            evict()
        for eco in engine_outputs.values():
            t4 = _clock()
            processor.process_outputs(eco.outputs, eco.timestamp, IterationStats())
            timing.api_s += _clock() - t4
        for q in queues:
            q.get_nowait()
        step += 1
        while waiting and len(scheduler.requests) < limit:  # a closed loop: one ends, one comes
            admit(waiting.pop())
    # Any record still open (none when every request ended) is closed as a disconnect would.
    t0 = _clock()
    api = STATE.part("request.api")
    for rid in list(api.book.live):
        api.settler.end(api.book.forget(rid), time.monotonic())
    api.settler.settle(give_up=True)
    timing.close_s = _clock() - t0
    timing.api_s += timing.close_s
    return timing


class _Front:
    """Stands in for starlette's ``StreamingResponse`` and ``AsyncLLM.add_request``: the HTTP
    side of one streamed request (a start message, one body chunk per output and the last one),
    so that the hooks there (``request.flush``: a box per response and a ``send`` in front of
    every chunk; ``request.caller``: the caller's headers) are timed through the registry."""

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None,
                    tokenization_kwargs=None, trace_headers=None):
        return None

    async def stream_response(self, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(self.n_outputs):
            if i == 1:  # the first output reached the API process: its chunk is timed
                box = request_state.FLUSH.get()
                if box is not None:
                    box.armed = True
            await send({"type": "http.response.body", "body": b"data: {}\n\n",
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _front_end(n_outputs: int, rounds: int) -> float:
    """Seconds per request added by the HTTP-side hooks (``request.flush``, ``request.caller``)
    to stand-ins with starlette's and vLLM's signatures, applied through the registry. With cold
    caches, the caches are evicted before each request (the eviction's own time left out), not
    between its chunks: in the server one step's chunks go out back to back."""
    front = _Front()
    front.n_outputs = n_outputs
    excluded = 0.0

    async def send(message):
        return None

    async def timed() -> float:
        nonlocal excluded
        excluded = 0.0
        t0 = _clock()
        for _ in range(rounds):
            if evict is not None:
                t = _clock()
                evict()
                excluded += _clock() - t
            headers = {"traceparent": _TRACEPARENT} if TRACED else None
            front.add_request("f", "p", None, trace_headers=headers)
            await front.stream_response(send)
        return _clock() - t0 - excluded

    targets = {"request.flush": "_Front.stream_response", "request.caller": "_Front.add_request"}
    hooks = [replace(h, target=f"{__name__}:{targets[h.name]}", applied=False)
             for h in request.HOOKS if h.name in targets]
    plain, hooked = [], []
    for _ in range(3):
        plain.append(await timed())
        hook_set = HookSet([replace(h, applied=False) for h in hooks])
        hook_set.apply_to(sys.modules[__name__])
        hooked.append(await timed())
        hook_set.remove(sys.modules[__name__])
    return (min(hooked) - min(plain)) / rounds


def measure(fresh, provider, n: int, tokens: int, rounds: int) -> dict:
    """Our own time, measured directly (hook wrappers minus the vLLM calls inside them, the
    HTTP-side hooks over stand-ins, OTLP encoding of what was produced), next to plain vLLM's
    time on the same code paths (runs without hooks, interleaved)."""
    timer_s, guard_s = guard_overhead()
    skipped = disabled_hooks(request.HOOKS, STATE.config)  # as the instrumentor leaves out
    plain: list[Timing] = []
    ours: list[dict] = []
    young = {"plain": 0, "full": 0}  # tracked objects that lived to count, over all rounds
    rpc_hook = replace(rpc.COLLECTIVE_RPC, target=f"{__name__}:_Executor.collective_rpc")
    for r in range(rounds):
        meter = Meter()
        hooks = HookSet([meter.timed(h) for h in [*request.HOOKS, rpc_hook]
                         if h.name not in skipped and h.name != "request.flush"], STATE)
        for mode in (("plain", "full") if r % 2 == 0 else ("full", "plain")):
            if mode == "full":
                hooks.apply()
            encode_round(provider)  # start from an empty batch
            with YoungObjects() as counted:
                timing = run_batch(fresh, n, tokens, seed=10 + r)
            young[mode] += counted.objects
            if mode == "plain":
                plain.append(timing)
                continue
            hooks.remove()
            encode_s, metrics_s, spans, size = encode_round(provider)
            cost = {side: meter.own.get(side, 0.0) + meter.guard_s(side, guard_s)
                    for side in ("api_server", "engine_core")}
            ours.append({"api_s": cost["api_server"] + timing.close_s,
                         "engine_s": cost["engine_core"], "encode_s": encode_s,
                         "metrics_s": metrics_s, "spans": spans, "bytes": size,
                         "steps": timing.request_steps, "by_hook": dict(meter.by_hook)})
    front = asyncio.run(_front_end(tokens, 2000 if evict is None else 500))

    # All-in per round (hooks, spans, metrics and the encoding of that round's spans together:
    # a round with more span trees costs more in both), then the fastest round.
    fastest = min(ours, key=lambda row: row["api_s"] + row["encode_s"])
    api, enc = fastest["api_s"] / n, fastest["encode_s"] / n
    eng = min(row["engine_s"] for row in ours) / n
    plain_api = min(t.api_s for t in plain) / n
    plain_eng = min(t.engine_s for t in plain) / n
    all_in = api + front + enc
    return {
        "output_tokens": tokens,
        "api_us_per_request_hooks_spans_metrics": api * 1e6,
        "api_us_per_request_http_side_hooks": front * 1e6,
        "api_us_per_request_otlp_span_encoding": enc * 1e6,
        "api_us_per_metrics_export_encoding": min(row["metrics_s"] for row in ours) * 1e6,
        "api_us_per_request_all_in": all_in * 1e6,
        "api_us_per_request_plain_vllm": plain_api * 1e6,
        "api_ratio_all_in": (plain_api + all_in) / plain_api,
        "spans_per_request": fastest["spans"] / n,
        # every round's all-in, us per request: the fastest round may be one without a span
        # tree (untraced, the policy's trees are a few per cent)
        "api_us_per_request_all_in_by_round": [
            round((row["api_s"] + row["encode_s"]) / n * 1e6 + front * 1e6, 1) for row in ours],
        "otlp_bytes_per_request": fastest["bytes"] / n,
        "engine_us_per_request": eng * 1e6,
        "engine_us_per_scheduled_request_step": eng * n / ours[-1]["steps"] * 1e6,
        "engine_us_per_request_plain_vllm": plain_eng * 1e6,
        "engine_ratio": (plain_eng + eng) / plain_eng,
        # each hook's own time in the fastest round (guards not included), us per request
        "us_per_request_by_hook": {name: round(s / n * 1e6, 2) for name, s in
                                   sorted(fastest["by_hook"].items(), key=lambda kv: -kv[1])},
        "guard_us_per_call": {kind: round(v * 1e6, 3) for kind, v in guard_s.items()},
        "timer_us_per_call": round(timer_s * 1e6, 3),
        # API and EngineCore sides together (one process here), over all rounds
        "young_objects_per_request_plain_vllm": round(young["plain"] / (n * rounds), 2),
        "young_objects_per_request_added": round((young["full"] - young["plain"])
                                                 / (n * rounds), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", default="16,256", help="output lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--traced", action="store_true",
                    help="every request with a sampled traceparent (its span is built)")
    ap.add_argument("--in-flight", type=int, default=0,
                    help="at most N requests in the engine at once, a new one as one ends (as "
                         "the end-to-end benchmark's closed loop cN with --max-num-seqs >= N: "
                         "one output per step at 1, so per-step costs count per token); 0: all "
                         "admitted at once")
    ap.add_argument("--caches", choices=("cold", "warm"), default="cold",
                    help="cold (default): the CPU caches evicted before each engine step's "
                         "halves, as a busy server's other work does; warm: back to back")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    try:
        lengths = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        raise SystemExit(f"--tokens {args.tokens!r}: output lengths, e.g. 16,256") from None
    if not lengths or min(lengths) < 1 or args.requests < 1 or args.rounds < 1:
        raise SystemExit("--tokens, --requests and --rounds: at least 1")
    global TRACED, IN_FLIGHT, STATE, evict
    TRACED, IN_FLIGHT = args.traced, args.in_flight
    evict = _Evictor() if args.caches == "cold" else None

    provider = install_providers()
    STATE = ProcessState(config.Config(), all_parts())
    fresh = build(str(ensure_tiny_model()), args.requests)
    hooks = HookSet(list(request.HOOKS), STATE)
    run_batch(fresh, args.requests, 16, seed=0)  # warm both paths' caches
    hooks.apply()
    run_batch(fresh, args.requests, 16, seed=1)
    hooks.remove()
    results = [measure(fresh, provider, args.requests, t, args.rounds) for t in lengths]
    figures: dict = {"requests": args.requests, "rounds": args.rounds, "caches": args.caches,
                     "traced": args.traced, "in_flight": args.in_flight or args.requests,
                     "by_length": results}
    if len(results) >= 2:  # all-in = per request + per output x output tokens
        a, b = results[0], results[-1]
        per_out = ((b["api_us_per_request_all_in"] - a["api_us_per_request_all_in"])
                   / (b["output_tokens"] - a["output_tokens"]))
        figures["api_us_per_streamed_output"] = per_out
        figures["api_us_per_request_fixed"] = (a["api_us_per_request_all_in"]
                                               - per_out * a["output_tokens"])
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        tmp = Path(f"{args.json}.tmp")
        tmp.write_text(text)
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
