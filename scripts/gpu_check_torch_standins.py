"""Stand-ins for vLLM's call sites, for the device check on a GPU image without vLLM.

Each class has the name, method names and signatures of the vLLM class our hook targets
(``tests/test_gpu_check_torch.py`` compares them with the installed vLLM), and does the CUDA work
vLLM does there, really: ``param.data.copy_`` of host tensors (vLLM's ``default_weight_loader``),
``torch.cuda.graph`` captures into one shared pool, largest first, with gc and ``empty_cache``
held off (vLLM's ``CUDAGraphWrapper``), KV tensors allocated on the device. The hooks are applied
to this module by the registry (``HookSet.apply_to``), exactly as to vLLM's.

``VLLM_ACCESSORS`` are the two places where our code asks vLLM itself (not a call site) a
question: which platform this is, and vLLM's compilation counter; the check answers them as vLLM
would on this GPU.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

from opentelemetry import trace

from otel_ttft.runtime.hooks import warmup
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load import weights as load_weights

HOOKS = [load_weights.GET_ALL_WEIGHTS, warmup.GRAPH_CAPTURE, warmup.KV_ALLOC]
"""The hooks the device check measures: the very objects the instrumentor registers."""

VLLM_ACCESSORS = [(load_shards, "device_is_accelerator"), (warmup, "_compilation_counter")]


def _vllm_tracer() -> trace.Tracer:
    """vLLM's ``@instrument(span_name=...)`` spans come from ``trace.get_tracer(module)``."""
    return trace.get_tracer("vllm")


class CUDAGraphMode(enum.Enum):
    """``vllm.config.CUDAGraphMode``: the runtime modes a capture runs under."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class BatchDescriptor:
    """``vllm.forward_context.BatchDescriptor``: one captured batch shape."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0


@dataclass
class CompilationCounter:
    """``vllm.compilation.counter.compilation_counter``: the capture count vLLM keeps."""

    num_cudagraph_captured: int = 0


@dataclass
class KVCacheTensor:
    """``vllm.v1.kv_cache_interface.KVCacheTensor``: one backing allocation."""

    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int


@dataclass
class KVCacheGroupSpec:
    """``vllm.v1.kv_cache_interface.KVCacheGroupSpec`` (its spec: only ``block_size`` is read)."""

    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    """``vllm.v1.kv_cache_interface.KVCacheConfig``."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def kv_cache_config(layers: int, num_blocks: int, block_size: int, page_bytes: int
                    ) -> KVCacheConfig:
    """A layer-outermost layout: one tensor of ``num_blocks`` pages per layer."""
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    tensors = [KVCacheTensor(size=num_blocks * page_bytes, layers=[name],
                             layer_stride=num_blocks * page_bytes, block_stride=page_bytes)
               for name in names]
    spec = SimpleNamespace(block_size=block_size, page_size_bytes=page_bytes)
    return KVCacheConfig(num_blocks, tensors, [KVCacheGroupSpec(names, spec)])


class WeightsModel:
    """A model's ``load_weights``: each host tensor goes into its device parameter through
    vLLM's ``default_weight_loader`` (a synchronous ``param.data.copy_``)."""

    def __init__(self, params: dict[str, Any]):
        self.params = params

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> set[str]:
        loaded = set()
        for name, loaded_weight in weights:
            param = self.params[name]
            assert param.size() == loaded_weight.size(), name
            param.data.copy_(loaded_weight)
            loaded.add(name)
        return loaded


class DefaultModelLoader:
    """``vllm.model_executor.model_loader.default_loader.DefaultModelLoader``."""

    def __init__(self, host_weights: list[tuple[str, Any]]):
        self.load_config = SimpleNamespace(load_format="safetensors",
                                           model_loader_extra_config={})
        self.host_weights = host_weights

    def get_all_weights(self, model_config: Any, model: Any) -> Iterator[tuple[str, Any]]:
        # vLLM yields what the shard reader returned: host tensors, pinned or pageable
        yield from self.host_weights

    def load_weights(self, model: Any, model_config: Any) -> None:
        with _vllm_tracer().start_as_current_span("Load weights"):
            model.load_weights(self.get_all_weights(model_config, model))


@contextlib.contextmanager
def _capture_quietly(torch: Any) -> Iterator[None]:
    """As ``CUDAGraphWrapper`` with ``gc_disable``: no gc and no cache emptying per graph."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(gc, "collect", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(torch.cuda, "empty_cache", lambda *a, **k: None))
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "empty_cache"):
            stack.enter_context(mock.patch.object(accelerator, "empty_cache",
                                                  lambda *a, **k: None))
        yield


class GPUModelRunner:
    """``vllm.v1.worker.gpu_model_runner.GPUModelRunner``: graph capture and the KV cache."""

    def __init__(self, model: Callable[[Any], Any], input_buffer: Any,
                 counter: CompilationCounter):
        import torch

        self.model = model
        self.input_buffer = input_buffer  # static: each graph reads a prefix of it
        self.counter = counter
        self.graph_pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream()  # vLLM's graph_capture(): a stream of its own
        self.graphs: dict[int, tuple[Any, Any]] = {}
        self.kv_caches: list[Any] = []

    def capture_model(self, plan: list[tuple[CUDAGraphMode, list[BatchDescriptor]]]) -> int:
        """vLLM's ``capture_model``: its plan comes from the dispatcher; here it is given."""
        import torch

        with _vllm_tracer().start_as_current_span("Capture model"):
            self.capture_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.capture_stream):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                start_free = torch.cuda.mem_get_info()[0]
                for mode, descriptors in plan:
                    self._capture_cudagraphs(batch_descriptors=descriptors,
                                             cudagraph_runtime_mode=mode, profiler=None)
                    torch.cuda.synchronize()
                end_free = torch.cuda.mem_get_info()[0]
            torch.cuda.current_stream().wait_stream(self.capture_stream)
        return start_free - end_free  # what vLLM logs as "Graph capturing ... took X GiB"

    def _capture_cudagraphs(self, batch_descriptors: list[BatchDescriptor],
                            cudagraph_runtime_mode: CUDAGraphMode,
                            profiler: Any = None) -> None:
        import torch

        assert cudagraph_runtime_mode != CUDAGraphMode.NONE, cudagraph_runtime_mode
        for desc in batch_descriptors:
            x = self.input_buffer[:desc.num_tokens]
            self.model(x)  # the warm-up run (cudagraph_num_of_warmups=1), on the capture stream
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with _capture_quietly(torch), torch.cuda.graph(graph, pool=self.graph_pool,
                                                          stream=torch.cuda.current_stream()):
                output = self.model(x)
            self.graphs[desc.num_tokens] = (graph, output)
            self.counter.num_cudagraph_captured += 1
            torch.cuda.synchronize()

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig, is_profiling: bool = False,
                            kv_cache_allocation_context: Any = None) -> None:
        import torch

        with kv_cache_allocation_context or contextlib.nullcontext():
            self.kv_caches = [torch.zeros(t.size, dtype=torch.int8, device="cuda")
                              for t in kv_cache_config.kv_cache_tensors]


class Worker:
    """``vllm.v1.worker.gpu_worker.Worker``: opens vLLM's "Allocate KV cache" span."""

    def __init__(self, model_runner: GPUModelRunner):
        self.model_runner = model_runner

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        with _vllm_tracer().start_as_current_span("Allocate KV cache"):
            self.model_runner.initialize_kv_cache(kv_cache_config,
                                                  kv_cache_allocation_context=None)


@contextlib.contextmanager
def vllm_answers(counter: CompilationCounter, is_accelerator: Callable[[], bool]
                 ) -> Iterator[None]:
    """Answer ``VLLM_ACCESSORS`` as vLLM would here: its platform, its compilation counter."""
    answers = {"device_is_accelerator": is_accelerator, "_compilation_counter": lambda: counter}
    with contextlib.ExitStack() as stack:
        for module, name in VLLM_ACCESSORS:
            stack.enter_context(mock.patch.object(module, name, answers[name]))
        yield


@contextlib.contextmanager
def hooked() -> Iterator[Any]:
    """``HOOKS`` applied to this module by the registry, as to vLLM's, with the process state
    ``_instrument`` makes; undone on exit."""
    from otel_ttft.runtime import config
    from otel_ttft.runtime.hooks import all_parts
    from otel_ttft.runtime.hooks.registry import HookSet
    from otel_ttft.runtime.state import ProcessState

    module = sys.modules[__name__]
    hook_set = HookSet(list(HOOKS), ProcessState(config.Config(), all_parts()))
    hook_set.apply_to(module)
    try:
        yield hook_set
    finally:
        hook_set.remove(module)
        hook_set.state.close()
