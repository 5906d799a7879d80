"""Graph capture, full and piecewise counted apart, on vLLM's real capture paths (issue 55).

V2: vLLM's real ``GPUModelRunner.capture_model`` and ``CudaGraphManager.capture`` (its capture
plan built by its own ``_init_candidates`` from the config), each piecewise shape run through
real ``CUDAGraphWrapper`` pieces under vLLM's forward context, as a compiled model's pieces are;
V1: vLLM's real ``_capture_cudagraphs`` and ``CUDAGraphWrapper``. Only what needs a GPU is stood
in: the CUDA graph object, its capture context and stream, the driver's memory reading. The
device check (``scripts/gpu-check-bare``) runs the same hooks on real captures."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import capture

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SIZES = [1, 2, 4, 8, 16, 32, 64]
MAX_SEQS = 8  # full decode graphs stop at 8 tokens; piecewise ones go to 64
PIECES = 3  # CUDA graphs per piecewise shape (a compiled model's pieces between attention)


class _Graph:
    """``torch.cuda.CUDAGraph`` (a capture needs a GPU): counts what was captured into it."""

    captured = 0

    def replay(self) -> None:
        pass


@contextlib.contextmanager
def _capturing(graph, pool=None, stream=None, **_):
    _Graph.captured += 1
    yield


@pytest.fixture
def no_cuda(monkeypatch):
    """What a capture asks of the GPU, answered on CPU; vLLM's code runs otherwise."""
    import vllm.v1.worker.gpu.cudagraph_utils as cu
    from vllm.compilation import monitor

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _capturing)
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
    _Graph.captured = 0
    yield cu


def _config(mode):
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


def _pieces(config):
    """The compiled model's pieces, each in vLLM's real ``CUDAGraphWrapper`` (PIECEWISE)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config.compilation import CUDAGraphMode

    return [CUDAGraphWrapper(lambda x: x + 1, config, CUDAGraphMode.PIECEWISE)
            for _ in range(PIECES)]


def _manager_class(cu):
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


def _v2_runner(config, manager, pieces):
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


def _modes():
    from vllm.config.compilation import CUDAGraphMode

    # (mode, full sizes, piecewise sizes): what vLLM's own plan captures for SIZES, MAX_SEQS
    return [(CUDAGraphMode.PIECEWISE, [], SIZES),
            (CUDAGraphMode.FULL, SIZES, []),
            (CUDAGraphMode.FULL_AND_PIECEWISE, [s for s in SIZES if s <= MAX_SEQS], SIZES)]


@pytest.mark.parametrize("case", range(3), ids=["piecewise-only", "full-only",
                                                 "full-and-piecewise"])
def test_v2_capture_counts_full_and_piecewise_apart(exporter, hooks, no_cuda, monkeypatch,
                                                    case):
    from vllm.compilation.counter import compilation_counter
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    mode, full, piecewise = _modes()[case]
    monkeypatch.setattr("vllm.v1.worker.gpu.model_runner.lock_workspace", lambda: None)
    config = _config(mode)
    manager = _manager_class(no_cuda)(config, torch.device("cpu"), mode, decode_query_len=1)
    hooks(capture.GRAPH_CAPTURE_V2, capture.GRAPH_CAPTURE_V2_SHAPES)
    before = compilation_counter.num_cudagraph_captured
    V2.capture_model(_v2_runner(config, manager, _pieces(config)))
    counted = compilation_counter.num_cudagraph_captured - before
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_GRAPH_CAPTURE]
    attrs = span.attributes
    desc = sorted(set(full) | set(piecewise), reverse=True)
    assert list(attrs[semconv.ATTR_GRAPH_FULL_BATCH_SIZES]) == sorted(full, reverse=True)
    assert list(attrs[semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES]) == \
        sorted(piecewise, reverse=True)
    assert attrs[semconv.ATTR_GRAPH_FULL_COUNT] == len(full)
    assert attrs[semconv.ATTR_GRAPH_PIECEWISE_COUNT] == len(piecewise)
    assert attrs[semconv.ATTR_GRAPH_PIECEWISE_PIECES] == PIECES * len(piecewise)
    assert list(attrs[semconv.ATTR_GRAPH_BATCH_SIZES]) == desc
    # vLLM's counter: every CUDA graph, pieces included; the graphs our stand-in made agree
    assert attrs[semconv.ATTR_GRAPH_COUNT] == counted == len(full) + PIECES * len(piecewise)
    assert _Graph.captured == counted
    assert attrs[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_GRAPH_CAPTURE


def test_v2_profiling_capture_is_not_tallied(exporter, hooks, no_cuda):
    """``capture_model(profile_only=True)``'s captures (a memory estimate) open no span and
    leave no tally for the real capture to inherit."""
    from vllm.config.compilation import CUDAGraphMode

    config = _config(CUDAGraphMode.PIECEWISE)
    manager = _manager_class(no_cuda)(config, torch.device("cpu"), CUDAGraphMode.PIECEWISE,
                                      decode_query_len=1)
    state = hooks(capture.GRAPH_CAPTURE_V2_SHAPES)
    manager.capture(_pieces(config), None, torch.zeros(max(SIZES)))
    assert state.part("warmup").graphs is None
    assert not exporter.get_finished_spans()


def test_v1_capture_counts_each_mode_apart(exporter, hooks, no_cuda, monkeypatch):
    """V1's real ``_capture_cudagraphs``, once per mode under vLLM's "Capture model"; its
    ``_warmup_and_capture`` (which needs a model and a GPU) runs the shape through real
    ``CUDAGraphWrapper`` pieces, or one FULL wrapper, as V1's compiled model does."""
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config.compilation import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    config = _config(CUDAGraphMode.FULL_AND_PIECEWISE)
    pieces = _pieces(config)
    whole = CUDAGraphWrapper(lambda x: x, config, CUDAGraphMode.FULL)

    def warmup_and_capture(self, desc, cudagraph_runtime_mode, **_):
        with set_forward_context(None, config, cudagraph_runtime_mode=cudagraph_runtime_mode,
                                 batch_descriptor=desc):
            x = whole(torch.zeros(desc.num_tokens))
            for piece in pieces:
                x = piece(x)

    monkeypatch.setattr(V1, "_warmup_and_capture", warmup_and_capture)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None, raising=False)
    runner = object.__new__(V1)
    runner.parallel_config = SimpleNamespace(use_ubatching=False)
    runner.load_config = SimpleNamespace(use_tqdm_on_load=False)
    runner.lora_config = None
    runner.vllm_config = config
    hooks(capture.GRAPH_CAPTURE)
    before = compilation_counter.num_cudagraph_captured
    with trace.get_tracer("vllm").start_as_current_span("Capture model"):
        V1._capture_cudagraphs(runner, [BatchDescriptor(n) for n in (64, 32, 16)],
                               CUDAGraphMode.PIECEWISE)
        V1._capture_cudagraphs(runner, [BatchDescriptor(n, num_reqs=n, uniform=True)
                                        for n in (8, 4)], CUDAGraphMode.FULL)
    (span,) = exporter.get_finished_spans()
    attrs = span.attributes
    assert list(attrs[semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES]) == [64, 32, 16]
    assert attrs[semconv.ATTR_GRAPH_PIECEWISE_PIECES] == 3 * PIECES
    assert list(attrs[semconv.ATTR_GRAPH_FULL_BATCH_SIZES]) == [8, 4]
    assert attrs[semconv.ATTR_GRAPH_FULL_COUNT] == 2
    assert attrs[semconv.ATTR_GRAPH_COUNT] == \
        compilation_counter.num_cudagraph_captured - before == 2 + 3 * PIECES
    assert list(attrs[semconv.ATTR_GRAPH_BATCH_SIZES]) == [64, 32, 16, 8, 4]
