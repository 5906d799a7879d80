"""EngineCore's per-step hooks on vLLM's real ``Scheduler``: the admission-time hook stands aside
for good on a scheduler whose stats logging stamps the events itself."""

from __future__ import annotations

import time

import pytest

from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import HookSet
from tests.request_engine import process_state

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _scheduler(model_dir, log_stats: bool, cls=None):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=str(model_dir), max_model_len=512, dtype="float32")
    cache = CacheConfig(block_size=32, enable_prefix_caching=False)
    cache.num_gpu_blocks = 64
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=512,
                            is_encoder_decoder=False)
    config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched)
    spec = FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return (cls or Scheduler)(config, kv, StructuredOutputManager(config), block_size=32,
                              log_stats=log_stats)


def _add(scheduler, rid: str) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.request import Request

    core = EngineCoreRequest(
        request_id=rid, prompt_token_ids=[11, 12, 13, 14], mm_features=None,
        sampling_params=SamplingParams(max_tokens=4), pooling_params=None,
        arrival_time=time.time(), lora_request=None, cache_salt=None, data_parallel_rank=None,
        external_req_id=rid)
    scheduler.add_request(Request.from_engine_core_request(core, None))


@pytest.fixture
def engine_hooks():
    """EngineCore's request hooks, applied with a fresh state; its ``noted`` requests are
    ``engine_hooks.noted``."""
    state = process_state()
    hooks = HookSet([h for h in request.HOOKS if h.process == "engine_core"], state)
    hooks.apply()
    hooks.noted = state.part("request.engine").noted
    yield hooks
    hooks.remove()
    state.close()


def test_a_scheduler_that_stamps_its_own_events_gets_no_admission_times_of_ours(
        tiny_model, engine_hooks):
    from vllm.v1.core.sched.scheduler import Scheduler

    scheduler = _scheduler(tiny_model, log_stats=True)
    _add(scheduler, "r-stats-1")
    scheduler.schedule()
    assert engine_hooks.noted["r-stats-1"].schedule == []  # vLLM's own events say it
    assert scheduler.schedule().total_num_scheduled_tokens >= 0
    engine_hooks.remove()  # uninstrumented: the same function as before
    assert scheduler.schedule.__func__ is Scheduler.schedule


def test_a_scheduler_without_stats_keeps_the_hook_and_gets_its_admission_times(
        tiny_model, engine_hooks):
    scheduler = _scheduler(tiny_model, log_stats=False)
    _add(scheduler, "r-nostats-1")
    before = time.monotonic()
    scheduler.schedule()
    scheduler.schedule()
    (kind, at), = engine_hooks.noted["r-nostats-1"].schedule
    assert before <= at <= time.monotonic()


def _step(scheduler, token: int = 5):
    """One engine step: vLLM's ``schedule``, a model output of one token per scheduled request,
    its ``update_from_output``; the outputs per request id."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=[[token] for _ in ids])
    outputs = scheduler.update_from_output(out, runner)
    return {o.request_id: o for eco in outputs.values() for o in eco.outputs}


def test_the_payload_rides_on_each_requests_first_output_only(tiny_model, engine_hooks):
    from otel_ttft.semconv import ENGINE_PAYLOAD_HEADER

    scheduler = _scheduler(tiny_model, log_stats=True)
    _add(scheduler, "r-pay-1")
    first = _step(scheduler)["r-pay-1"]
    assert ENGINE_PAYLOAD_HEADER in first.trace_headers
    later = _step(scheduler)["r-pay-1"]
    assert not (later.trace_headers or {})
    _add(scheduler, "r-pay-2")
    outputs = _step(scheduler)
    assert ENGINE_PAYLOAD_HEADER in outputs["r-pay-2"].trace_headers
    assert not (outputs["r-pay-1"].trace_headers or {})
