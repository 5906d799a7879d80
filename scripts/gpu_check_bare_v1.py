"""Stand-ins with the names and signatures of vLLM's V1 call sites our hooks wrap, for the bare
GPU check: the default loader's safetensors path, V1's ``GPUModelRunner`` (graph capture per
mode under vLLM's "Capture model", the KV cache) and the worker's "Allocate KV cache".
``tests/test_gpu_check_bare.py`` compares their signatures with the installed vLLM. The CUDA
work is ``gpu_check_bare_model``'s, really done."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from opentelemetry import trace

from scripts import gpu_check_bare_model as model


def _vllm_tracer() -> trace.Tracer:
    """vLLM's ``@instrument(span_name=...)`` spans come from ``trace.get_tracer(module)``."""
    return trace.get_tracer("vllm")


def safe_open(filename: str, framework: str, device: str = "cpu") -> Any:
    """``weight_utils.safe_open``: safetensors' own (memory-mapped)."""
    from safetensors import safe_open as real

    return real(filename, framework=framework, device=device)


def safetensors_weights_iterator(hf_weights_files: list[str], use_tqdm_on_load: bool = False,
                                 safetensors_load_strategy: str = "lazy") -> Iterator[Any]:
    """``default_loader.safetensors_weights_iterator``: file by file, tensor by tensor."""
    for path in hf_weights_files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safetensors' API
                yield name, f.get_tensor(name)


class DefaultModelLoader:
    """``model_loader.default_loader.DefaultModelLoader``: the safetensors files, or host
    tensors given (the H2D part: pinned or pageable)."""

    def __init__(self, files: list[str] | None = None,
                 host_weights: list[tuple[str, Any]] | None = None) -> None:
        self.load_config = SimpleNamespace(load_format="safetensors",
                                           model_loader_extra_config={})
        self.files, self.host_weights = files or [], host_weights

    def get_all_weights(self, model_config: Any, model: Any) -> Iterator[tuple[str, Any]]:
        if self.host_weights is not None:
            yield from self.host_weights
        else:
            yield from safetensors_weights_iterator(self.files)

    def load_weights(self, model: Any, model_config: Any) -> None:
        with _vllm_tracer().start_as_current_span("Load weights"):
            model.load_weights(self.get_all_weights(model_config, model))


class WeightsModel:
    """A model's ``load_weights``: vLLM's ``default_weight_loader`` (``param.data.copy_``)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> set[str]:
        loaded = set()
        for name, loaded_weight in weights:
            self.params[name].data.copy_(loaded_weight)
            loaded.add(name)
        return loaded


class GPUModelRunner:
    """``vllm.v1.worker.gpu_model_runner.GPUModelRunner``."""

    def __init__(self, net: model.PiecewiseModel | None, device: str = "cuda") -> None:
        self.net, self.device, self.kv_caches = net, device, {}
        self.vllm_config = None

    def capture_model(self, plan: list[tuple[model.CUDAGraphMode, list[Any]]]) -> int:
        """V1's: vLLM's span around a ``_capture_cudagraphs`` call per mode, PIECEWISE first;
        returns vLLM's "took X GiB" reading (the driver's free memory around it)."""
        import torch

        with _vllm_tracer().start_as_current_span("Capture model"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info()[0]
            for mode, descriptors in plan:
                self._capture_cudagraphs(descriptors, mode)
            torch.cuda.synchronize()
            return free - torch.cuda.mem_get_info()[0]

    def _capture_cudagraphs(self, batch_descriptors: list[Any],
                            cudagraph_runtime_mode: model.CUDAGraphMode,
                            profiler: Any = None) -> None:
        assert cudagraph_runtime_mode.name in ("FULL", "PIECEWISE"), cudagraph_runtime_mode
        for desc in batch_descriptors:
            self.net.capture(cudagraph_runtime_mode.name, desc.num_tokens)

    def initialize_kv_cache(self, kv_cache_config: model.KVCacheConfig, is_profiling: bool = False,
                            kv_cache_allocation_context: Any = None) -> None:
        import torch

        with kv_cache_allocation_context or contextlib.nullcontext():
            self.kv_caches = model.allocate_kv(torch, kv_cache_config, self.device)


class Worker:
    """``vllm.v1.worker.gpu_worker.Worker``: opens vLLM's "Allocate KV cache"."""

    def __init__(self, model_runner: Any) -> None:
        self.model_runner = model_runner

    def initialize_from_config(self, kv_cache_config: model.KVCacheConfig) -> None:
        with _vllm_tracer().start_as_current_span("Allocate KV cache"):
            self.model_runner.initialize_kv_cache(kv_cache_config,
                                                  kv_cache_allocation_context=None)
