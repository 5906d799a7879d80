"""Stand-ins with the names and signatures of Model Runner V2's call sites our hooks wrap, for
the bare GPU check: ``GPUModelRunner.capture_model`` (no span of vLLM's; a ``profile_only`` call
first), ``CudaGraphManager`` (``capture(create_forward_fn)`` asking for each shape's warm-up
forward, PIECEWISE first then FULL; ``dispatch``; ``captured_token_counts`` listing the full
graphs only), the KV cache, and the worker's ``execute_model`` for serving steps. Compared with
the installed vLLM by ``tests/test_gpu_check_bare.py``; the CUDA work is really done."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from scripts import gpu_check_bare_model as model


class CudaGraphManager:
    """``vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager``."""

    def __init__(self, sizes: list[int], mode: model.CUDAGraphMode, max_num_reqs: int) -> None:
        self.cudagraph_mode = mode
        self.compilation_config = SimpleNamespace(cudagraph_capture_sizes=sorted(sizes),
                                                  max_cudagraph_capture_size=max(sizes),
                                                  mode=SimpleNamespace(name="NONE"))
        piecewise = sorted(sizes, reverse=True) if mode.mixed_mode().name == "PIECEWISE" else []
        full = [n for n in sorted(sizes, reverse=True) if n <= max_num_reqs] \
            if mode.name == "FULL_AND_PIECEWISE" else \
            (sorted(sizes, reverse=True) if mode.name == "FULL" else [])
        uniform = 1 if mode.name == "FULL_AND_PIECEWISE" else None
        self._capture_descs = {
            "PIECEWISE": [model.BatchExecutionDescriptor(model.PIECEWISE, n, None)
                          for n in piecewise],
            "FULL": [model.BatchExecutionDescriptor(model.FULL, n, min(n, max_num_reqs), uniform)
                     for n in full]}
        self.graphs: dict[Any, Any] = {}
        self._graphs_captured = False

    def capture(self, create_forward_fn: Any,
                progress_bar_desc: str = "Capturing CUDA graphs") -> None:
        for mode in ("PIECEWISE", "FULL"):
            for desc in self._capture_descs[mode]:
                forward_fn = create_forward_fn(desc, warmup=True)
                forward_fn(model.NONE)
                if mode == "PIECEWISE":
                    forward_fn(model.PIECEWISE)
                else:
                    self.graphs[desc] = create_forward_fn(desc, warmup=False)(model.FULL)
        self._graphs_captured = True

    def captured_token_counts(self) -> list[int]:
        return sorted({d.num_tokens for d in self.graphs if d.num_active_loras == 0})

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
                 num_active_loras: int, max_query_len: int | None = None,
                 num_ubatches: int = 1) -> model.BatchExecutionDescriptor:
        if self._graphs_captured:
            for desc in sorted(self.graphs, key=lambda d: d.num_tokens):
                if desc.num_tokens >= num_tokens and (desc.uniform_token_count is None or
                                                     desc.uniform_token_count
                                                     == uniform_token_count) \
                        and desc.num_reqs >= num_reqs:
                    return desc
            for desc in reversed(self._capture_descs["PIECEWISE"]):
                if desc.num_tokens >= num_tokens:
                    return desc
        return model.BatchExecutionDescriptor(model.NONE, num_tokens, num_reqs)


@dataclass
class ModelRunnerOutput:
    """``vllm.v1.outputs.ModelRunnerOutput`` (what our hooks read of it)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    cudagraph_stats: model.CUDAGraphStat | None = None
    sampled: Any = None


@dataclass
class GPUModelRunner:
    """``vllm.v1.worker.gpu.model_runner.GPUModelRunner``."""

    net: model.PiecewiseModel | None
    cudagraph_manager: CudaGraphManager | None
    device: str = "cuda"
    cudagraph_metrics: bool = False
    ran: list[tuple[str, int]] = field(default_factory=list)  # (mode, padded) per step
    kv_caches: dict[str, Any] = field(default_factory=dict)
    vllm_config: Any = None
    step_work: Any = None  # a first-use kernel some steps launch

    def capture_model(self, *, profile_only: bool = False) -> int:
        import torch

        torch.cuda.synchronize()  # (vLLM empties the cache first: kept here, see graphs())
        free = torch.cuda.mem_get_info()[0]
        if profile_only:  # vLLM's estimate: a sample captured and dropped (not the stage)
            sample = model.PiecewiseModel(torch, self.net.weights[0][0].shape[1], 1,
                                          self.net.inputs[0].shape[0], self.net.counter)
            sample.capture("FULL", 1)
            del sample
        else:
            self.cudagraph_manager.capture(self._create_forward_fn)
        torch.cuda.synchronize()
        return free - torch.cuda.mem_get_info()[0]

    def _create_forward_fn(self, desc: Any, warmup: bool) -> Any:
        def forward(mode: model.CUDAGraphMode) -> Any:
            if mode.name == "NONE":
                return self.net.eager(desc.num_tokens)
            self.net.capture(mode.name, desc.num_tokens)
            return self.net.full.get(desc.num_tokens)
        return forward

    def initialize_kv_cache(self, kv_cache_config: model.KVCacheConfig, is_profiling: bool = False,
                            kv_cache_allocation_context: Any = None) -> None:
        import torch

        with kv_cache_allocation_context or contextlib.nullcontext():
            self.kv_caches = model.allocate_kv(torch, kv_cache_config, self.device)

    def execute_model(self, scheduler_output: Any) -> ModelRunnerOutput:
        """A step: dispatch, then the graph (or the eager forward) it chose; nothing waits on
        the device."""
        n = scheduler_output.total_num_scheduled_tokens
        reqs = list(scheduler_output.num_scheduled_tokens)
        desc = self.cudagraph_manager.dispatch(len(reqs), n, None, 0)
        self.net.inputs[0][:desc.num_tokens].normal_()
        if desc.cg_mode.name == "NONE":
            out = self.net.eager(n)
        else:
            out = self.net.replay(desc.cg_mode.name, desc.num_tokens)
        if self.step_work is not None:
            self.step_work(out)
        self.ran.append((desc.cg_mode.name, desc.num_tokens))
        stats = model.CUDAGraphStat(n, desc.num_tokens, desc.num_tokens - n,
                                    str(desc.cg_mode)) if self.cudagraph_metrics else None
        return ModelRunnerOutput(reqs, {r: i for i, r in enumerate(reqs)}, stats,
                                 out[:, :1].argmax(0))


class Worker:
    """``vllm.v1.worker.gpu_worker.Worker``: a serving step."""

    def __init__(self, model_runner: GPUModelRunner) -> None:
        self.model_runner = model_runner
        self.device = SimpleNamespace(type="cuda")

    def execute_model(self, scheduler_output: Any) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)


def prefill_step(req_id: str, tokens: int) -> Any:
    """``vllm.v1.core.sched.output.SchedulerOutput`` for one new request's whole prompt."""
    new = SimpleNamespace(req_id=req_id, prompt_token_ids=list(range(tokens)),
                          num_computed_tokens=0)
    return SimpleNamespace(scheduled_new_reqs=[new], num_scheduled_tokens={req_id: tokens},
                           total_num_scheduled_tokens=tokens, finished_req_ids=set())
