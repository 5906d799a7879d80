"""Graph capture, full and piecewise counted apart, on vLLM's real capture paths (issue 55).

V2: vLLM's real ``GPUModelRunner.capture_model`` and ``CudaGraphManager.capture`` (its capture
plan built by its own ``_init_candidates`` from the config), each piecewise shape run through
real ``CUDAGraphWrapper`` pieces under vLLM's forward context, as a compiled model's pieces are;
V1: vLLM's real ``_capture_cudagraphs`` and ``CUDAGraphWrapper``. Only what needs a GPU is stood
in: the CUDA graph object, its capture context and stream, the driver's memory reading. The
device check (``scripts/gpu-check-bare``) runs the same hooks on real captures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import capture
from tests.cudagraph_plants import (
    MAX_SEQS,
    PIECES,
    SIZES,
    Graph,
    config_for,
    manager_class,
    pieces,
    stand_in_cuda,
    v2_runner,
)

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def no_cuda(monkeypatch):
    """vLLM's ``cudagraph_utils`` with only its GPU calls answered on CPU."""
    return stand_in_cuda(monkeypatch)

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
    config = config_for(mode)
    manager = manager_class(no_cuda)(config, torch.device("cpu"), mode, decode_query_len=1)
    hooks(capture.GRAPH_CAPTURE_V2, capture.GRAPH_CAPTURE_V2_SHAPES)
    before = compilation_counter.num_cudagraph_captured
    V2.capture_model(v2_runner(config, manager, pieces(config)))
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
    assert Graph.captured == counted
    assert attrs[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_GRAPH_CAPTURE


def test_v2_profiling_capture_is_not_tallied(exporter, hooks, no_cuda):
    """``capture_model(profile_only=True)``'s captures (a memory estimate) open no span and
    leave no tally for the real capture to inherit."""
    from vllm.config.compilation import CUDAGraphMode

    config = config_for(CUDAGraphMode.PIECEWISE)
    manager = manager_class(no_cuda)(config, torch.device("cpu"), CUDAGraphMode.PIECEWISE,
                                      decode_query_len=1)
    state = hooks(capture.GRAPH_CAPTURE_V2_SHAPES)
    manager.capture(pieces(config), None, torch.zeros(max(SIZES)))
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

    config = config_for(CUDAGraphMode.FULL_AND_PIECEWISE)
    parts = pieces(config)
    whole = CUDAGraphWrapper(lambda x: x, config, CUDAGraphMode.FULL)

    def warmup_and_capture(self, desc, cudagraph_runtime_mode, **_):
        with set_forward_context(None, config, cudagraph_runtime_mode=cudagraph_runtime_mode,
                                 batch_descriptor=desc):
            x = whole(torch.zeros(desc.num_tokens))
            for piece in parts:
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
