"""vLLM's real CUDA-graph capture and dispatch classes, run on CPU: only what needs a GPU is
stood in (the CUDA graph object, its capture context and stream, the driver's memory reading),
for tests/test_graph_capture.py and tests/test_graph_dispatch.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

SIZES = [1, 2, 4, 8, 16, 32, 64]
MAX_SEQS = 8  # full decode graphs stop at 8 tokens; piecewise ones go to 64
PIECES = 3  # CUDA graphs per piecewise shape (a compiled model's pieces between attention)


class Graph:
    """``torch.cuda.CUDAGraph`` (a capture needs a GPU): counts what was captured into it."""

    captured = 0

    def replay(self) -> None:
        pass


@contextlib.contextmanager
def capturing(graph, pool=None, stream=None, **_):
    Graph.captured += 1
    yield


def stand_in_cuda(monkeypatch):
    """What a capture asks of the GPU, answered on CPU; vLLM's code runs otherwise."""
    import vllm.v1.worker.gpu.cudagraph_utils as cu
    from vllm.compilation import monitor

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    # a weak reference to a graph's output in CUDA memory (a CUDA-only op)
    monkeypatch.setattr("vllm.compilation.cuda_graph.weak_ref_tensors", lambda t: t)
    monkeypatch.setattr(cu, "graph_capture", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cu, "current_stream", lambda: None)
    monkeypatch.setattr(cu, "get_pp_group",
                        lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True))
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "graph_pool_handle", lambda: "pool", raising=False)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (1 << 30, 1 << 31),
                        raising=False)
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda *a: None, raising=False)
    monitor.set_cudagraph_capturing_enabled(True)
    Graph.captured = 0
    return cu


def config_for(mode):
    """A real ``VllmConfig`` with CUDA graphs in ``mode`` (the CPU platform turns them off at
    construction; set afterwards, as a GPU platform leaves them)."""
    from vllm.config import SchedulerConfig, VllmConfig
    from vllm.config.compilation import CompilationMode

    config = VllmConfig(scheduler_config=SchedulerConfig(
        max_num_seqs=MAX_SEQS, max_num_batched_tokens=2048, max_model_len=2048,
        is_encoder_decoder=False))
    cc = config.compilation_config
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.cudagraph_mode, cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = \
        mode, list(SIZES), max(SIZES)
    return config


def pieces(config):
    """The compiled model's pieces, each in vLLM's real ``CUDAGraphWrapper`` (PIECEWISE)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config.compilation import CUDAGraphMode

    return [CUDAGraphWrapper(lambda x: x + 1, config, CUDAGraphMode.PIECEWISE)
            for _ in range(PIECES)]


def manager_class(cu):
    class Manager(cu.CudaGraphManager):
        """``ModelCudaGraphManager``'s shape: its ``capture`` builds ``create_forward_fn`` and
        hands it to the base class's (the hooked one)."""

        def capture(self, model, model_state, input_buffers, *args, **kwargs):
            from vllm.forward_context import BatchDescriptor, set_forward_context

            def create_forward_fn(desc, warmup):
                def forward(mode):
                    key = BatchDescriptor(num_tokens=desc.num_tokens)
                    with set_forward_context(None, self.vllm_config, cudagraph_runtime_mode=mode,
                                             batch_descriptor=key):
                        x = input_buffers[:desc.num_tokens]
                        for piece in model:
                            x = piece(x)
                return forward

            return super().capture(create_forward_fn)
    return Manager


def v2_runner(config, manager, pieces):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    runner = object.__new__(V2)
    attrs = dict(vllm_config=config, cudagraph_manager=manager, model=pieces,
                 model_state=SimpleNamespace(supports_mm_inputs=False,
                                             capture_inner_cudagraphs=lambda *a, **k: None),
                 lora_config=None, input_buffers=torch.zeros(max(SIZES)), pcp_manager=None,
                 intermediate_tensors=None, block_tables=None, attn_groups=[],
                 kv_cache_config=None, use_aux_hidden_state_outputs=False, speculator=None,
                 adaptive_verification=None,
                 kv_connector=SimpleNamespace(reset_capture_state=lambda: None))
    for key, value in attrs.items():
        setattr(runner, key, value)
    return runner
