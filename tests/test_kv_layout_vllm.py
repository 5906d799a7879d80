"""KV bytes, blocks and token capacity of a hybrid model, on vLLM's real classes (issue 55).

A model with one sliding-window and one full-attention layer (the tiny hybrid checkpoint) gets
two KV-cache groups from vLLM's own ``get_kv_cache_configs``; vLLM's ``allocate_kv_cache``
allocates them on the CPU as one buffer both groups view. Our figures are compared with that
allocation (each storage once) and with vLLM's own capacity (the "KV cache size" it logs).
"""

from __future__ import annotations

import pytest
import torch

from otel_ttft import semconv
from otel_ttft.runtime.hooks import kv_layout, warmup
from otel_ttft.tools.tiny_model import HYBRID_WINDOW, ensure_tiny_hybrid_model

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

GIB, MIB = 1 << 30, 1 << 20
MAX_MODEL_LEN, CHUNK = 2048, 256  # a window's blocks hold the window and one chunk
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


@pytest.fixture(scope="module")
def hybrid():
    """(vllm_config, kv_cache_config) of the tiny hybrid model with 1 GiB for its KV cache, as
    EngineCore computes them (the layout resolved first, as EngineCore does)."""
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    model = ensure_tiny_hybrid_model()
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(model), max_model_len=MAX_MODEL_LEN, dtype="float32"),
        scheduler_config=SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
                                         max_num_batched_tokens=CHUNK))
    shape = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": torch.float32}
    specs = {LAYERS[0]: SlidingWindowSpec(**shape, sliding_window=HYBRID_WINDOW),
             LAYERS[1]: FullAttentionSpec(**shape)}
    layouts = [layout.name for layout in get_supported_kv_cache_layouts([])]
    resolve_kv_cache_layout(vllm_config, [layouts], specs.values())
    (config,) = get_kv_cache_configs(vllm_config, [specs], [GIB])
    return vllm_config, config


def _allocated(vllm_config, config) -> int:
    """What vLLM's allocator really allocated: each distinct storage once."""
    from vllm.v1.worker.utils import allocate_kv_cache

    caches = allocate_kv_cache(config, torch.device("cpu"),
                               vllm_config.cache_config.get_resolved_kv_cache_layout())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in caches.values()}
    assert set(caches) == set(LAYERS)
    return sum(storages.values())


def test_a_shared_buffer_is_counted_once_and_capacity_is_vllms(hybrid):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    vllm_config, config = hybrid
    assert len(config.kv_cache_groups) == 2 and len(config.kv_cache_tensors) == 2
    attrs = kv_layout.kv_cache_attributes(config, vllm_config)
    assert attrs[semconv.ATTR_KV_BYTES] == _allocated(vllm_config, config) == GIB
    tokens, concurrency = get_kv_cache_capacity(vllm_config, config)
    assert attrs[semconv.ATTR_KV_TOKEN_CAPACITY] == tokens
    assert attrs[semconv.ATTR_KV_MAX_CONCURRENCY] == pytest.approx(concurrency, rel=1e-4)
    assert attrs[semconv.ATTR_KV_BLOCKS] == config.num_blocks
    assert attrs[semconv.ATTR_KV_GROUPS] == 2
    assert attrs[semconv.ATTR_KV_GROUP_SPECS] == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert attrs[semconv.ATTR_KV_GROUP_LAYERS] == [1, 1]
    window, full = attrs[semconv.ATTR_KV_GROUP_BLOCKS_PER_REQUEST]
    assert full == MAX_MODEL_LEN // 16 and window < full // 4  # the window's, not the sequence's


def test_the_allocation_span_on_v1_and_v2_carries_the_bytes_allocated(hybrid, exporter, hooks):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    vllm_config, config = hybrid
    hooks(warmup.KV_ALLOC, warmup.KV_ALLOC_V2)
    for cls in (V1, V2):
        runner = object.__new__(cls)  # vLLM's real method; its body needs a built runner
        runner.vllm_config = vllm_config
        with pytest.raises(AttributeError):
            cls.initialize_kv_cache(runner, config)
    allocated = _allocated(vllm_config, config)
    spans = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_KV_ALLOC]
    assert len(spans) == 2
    for span in spans:
        assert span.attributes[semconv.ATTR_KV_BYTES] == allocated
        assert span.attributes[semconv.ATTR_KV_GROUPS] == 2
        assert span.attributes[semconv.ATTR_KV_TOKEN_CAPACITY] < (
            config.num_blocks * 16)  # the two groups share the blocks


def test_the_layout_before_the_shared_buffer_is_one_allocation_per_tensor():
    """A ``KVCacheTensor`` without placement fields (vLLM before 0.32) owned its allocation."""
    from types import SimpleNamespace as NS

    old = [NS(size=100), NS(size=200)]
    shared = [NS(size=300, layer_stride=1), NS(size=300, layer_stride=1),
              NS(size=50, layer_stride=1, host_resident=True)]
    assert kv_layout.allocated_bytes(old) == (300, 0)
    assert kv_layout.allocated_bytes(shared) == (300, 50)


# --- the change rules' memory advice, from the span our hook puts on the two-group allocation ---

def _facts(attributes) -> dict:
    from otel_ttft.diagnosis.record import FACT_ATTRIBUTES

    return {name: attributes[key] for name, key in FACT_ATTRIBUTES.items() if key in attributes}


@pytest.fixture
def hybrid_facts(hybrid, exporter, hooks):
    """The facts `change` sizes by, read from the "Allocate KV cache" span of the two-group
    allocation (V1's hook on vLLM's real method), on an 8 GiB CUDA device."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    vllm_config, config = hybrid
    hooks(warmup.KV_ALLOC)
    runner = object.__new__(V1)
    runner.vllm_config = vllm_config
    with pytest.raises(AttributeError):
        V1.initialize_kv_cache(runner, config)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_KV_ALLOC]
    return {**_facts(span.attributes), "model_bytes": 4 * MIB, "device_memory_bytes": 8 * GIB,
            "host_memory_bytes": 8 * GIB, "device_type": "cuda"}


def test_the_memory_advice_uses_the_bytes_allocated(hybrid, hybrid_facts):
    from otel_ttft.tools.analysis import change, knobs
    from otel_ttft.tools.analysis.breakdown import ActivationSummary
    from tests.test_change import BASE, _row, _run, _verdict

    vocab = knobs.vocabulary()
    vllm_config, config = hybrid
    acts = [ActivationSummary("t" + m, m, "start", 0, 1, [], facts=dict(hybrid_facts))
            for m in ("A", "B")]
    # the profile run: state the size it found, once
    v = _verdict("cold-switch", "warmup", "warmup.profile", "persist-artifacts")
    ch = change.propose(v, [_row("cold-switch", ttft=60, model="B",
                                 subs={"warmup.profile": 30})], BASE, _run(), acts, vocab)
    assert ch["candidates"][0]["args"] == ["--kv-cache-memory-bytes", str(GIB)]
    # do both fit, and the resident servers' memory split: 1 GiB of KV each, not 2
    v = _verdict("switch-back", "warmup", "warmup.process_start", "keep-resident")
    ch = change.propose(v, [_row("switch-back", ttft=50, subs={"warmup.process_start": 30})],
                        BASE, _run(), acts, vocab)
    resident = ch["candidates"][0]
    assert resident["id"] == "resident" and "A 1.00 GiB + B 1.00 GiB" in resident["reason"]
    need = (GIB + 4 * MIB) * 1.25 / (8 * GIB)
    assert resident["args"] == ["--gpu-memory-utilization", f"{-(-need * 100 // 1) / 100:.2f}"]
    # the KV budget for 4 requests of 1,908 tokens: blocks in both groups, 16 KiB a block
    v = _verdict("long-prompt", "warmup", "warmup.kv_alloc", "tune-admission")
    rows = [_row("long-prompt", ttft=3, prompt="long", tokens=1900,
                 subs={"warmup.kv_alloc": 2})] * 4
    ch = change.propose(v, rows, BASE, _run(concurrency=4), acts, vocab)
    sliding = config.kv_cache_groups[0].kv_cache_spec  # vLLM's count of a window's blocks
    window = -(-sliding.max_memory_usage_bytes(vllm_config) // sliding.page_size_bytes)
    per_block = GIB // config.num_blocks
    assert ch["candidates"][0]["args"] == [
        "--kv-cache-memory-bytes", str(4 * (-(-1908 // 16) + window) * per_block)]
