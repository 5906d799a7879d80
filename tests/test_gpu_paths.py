"""GPU-only paths, exercised on CPU through the real vLLM functions wherever they run here:
graph-capture enrichment, host-to-device accounting over the real safetensors reader, and the
sleep/wake activation around the real EngineCore methods. scripts/gpu-check covers the rest."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import activation, warmup
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load import weights as load

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _finished(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_graph_capture_enriches_vllms_capture_span(exporter, hooks):
    hooks(warmup.GRAPH_CAPTURE)
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class Runner(GPUModelRunner):
        def __init__(self):  # the real __init__ needs a full config and a device
            pass

    with trace.get_tracer("vllm").start_as_current_span("Capture model"):
        # No descriptors: the real vLLM method validates the mode and returns before CUDA.
        Runner()._capture_cudagraphs([], CUDAGraphMode.FULL)
    (span,) = _finished(exporter, "Capture model")
    assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_GRAPH_CAPTURE
    assert span.attributes[semconv.ATTR_GRAPH_COUNT] == 0
    assert list(span.attributes[semconv.ATTR_GRAPH_BATCH_SIZES]) == []
    with pytest.raises(AssertionError):  # vLLM's own check still runs, unchanged
        Runner()._capture_cudagraphs([], CUDAGraphMode.NONE)


def test_host_to_device_totals_over_the_real_safetensors_reader(exporter, hooks, tiny_model,
                                                                monkeypatch):
    hooks(load.SAFE_OPEN)
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    from otel_ttft.tools.tiny_model import checkpoint_files

    monkeypatch.setattr(load_shards, "device_is_accelerator", lambda: True)  # what a GPU reports
    files = [str(f) for f in checkpoint_files(tiny_model)]
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as weights_span:
        tensors = list(load._totals_generator(safetensors_weights_iterator(files, False),
                                              weights_span))
    (weights,) = _finished(exporter, "Load weights")
    tensor_bytes = sum(t.numel() * t.element_size() for _, t in tensors)
    assert weights.attributes[semconv.ATTR_H2D_BYTES] == tensor_bytes
    assert weights.attributes[semconv.ATTR_H2D_GB_PER_S] > 0
    assert weights.attributes[semconv.ATTR_LOAD_SHARDS] == len(files)
    shards = _finished(exporter, semconv.SPAN_SHARD_READ)
    assert sorted(s.attributes[semconv.ATTR_SHARD_PATH] for s in shards) == sorted(files)
    assert all(s.parent.span_id == weights.context.span_id for s in shards)


class _Executor:
    """Stands in for the GPU executor (sleep mode is rejected on CPU); records what it is asked."""

    is_sleeping = False

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))
        return True


class _Scheduler:
    """Only for vLLM >= 0.33, whose ``wake_up`` asks the scheduler for a KV connector."""

    def get_kv_connector(self):
        return None


def test_sleep_and_wake_up_around_the_real_engine_core_methods(exporter, hooks):
    hooks(*[h for h in activation.HOOKS if h.name in ("switch.engine_sleep",
                                                      "switch.engine_wake_up")])
    from vllm.v1.engine.core import EngineCore

    engine = EngineCore.__new__(EngineCore)  # its __init__ loads a model; the methods do not
    engine.model_executor = _Executor()
    engine.scheduler = _Scheduler()
    engine.pause_scheduler = lambda mode, clear_cache: None
    engine.resume_scheduler = lambda: None
    EngineCore.sleep(engine, 1)
    assert EngineCore.wake_up(engine, None) is True
    assert engine.model_executor.calls == [("sleep", 1), ("wake_up", None)]
    (sleep,) = _finished(exporter, semconv.SPAN_SLEEP)
    assert sleep.attributes[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH_SLEEP
    assert sleep.attributes[semconv.ATTR_SLEEP_LEVEL] == 1
    (root,) = _finished(exporter, semconv.SPAN_ACTIVATION)
    assert root.attributes[semconv.ATTR_ACTIVATION_KIND] == "wake"
    (wake,) = _finished(exporter, semconv.SPAN_WAKE_UP)
    assert wake.parent.span_id == root.context.span_id
    assert wake.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD_H2D
    last = activation.last_activation()
    assert last.kind == "wake" and last.span_context.span_id == root.context.span_id
