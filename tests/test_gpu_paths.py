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


def test_host_to_device_totals_over_the_real_safetensors_reader(exporter, tiny_model,
                                                                monkeypatch):
    from otel_ttft.runtime.config import Config
    from otel_ttft.runtime.hooks.load import PARTS
    from otel_ttft.runtime.hooks.registry import HookSet
    from otel_ttft.runtime.state import PartSpec, ProcessState
    from otel_ttft.runtime.telemetry import metrics as stage_metrics
    from otel_ttft.tools.tiny_model import checkpoint_files

    state = ProcessState(Config(), [PartSpec(stage_metrics.PART, stage_metrics.StageMetrics),
                                    *PARTS])
    hook_set = HookSet([load.SAFE_OPEN, load.SAFETENSORS_READS], state)
    hook_set.apply()
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    monkeypatch.setattr(load_shards, "device_is_accelerator", lambda: True)  # what a GPU reports
    files = [str(f) for f in checkpoint_files(tiny_model)]
    try:
        with trace.get_tracer("vllm").start_as_current_span("Load weights") as weights_span:
            tensors = list(load._totals_generator(state.part(load_shards.STATE),
                                                  safetensors_weights_iterator(files, False),
                                                  weights_span))
    finally:
        hook_set.remove()
        state.close()
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
    state = hooks(*[h for h in activation.HOOKS if h.name in ("switch.engine_sleep",
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
    last = state.part(activation.PART).latest
    assert last.kind == "wake" and last.span_context.span_id == root.context.span_id


def _request_hook(name):
    from otel_ttft.runtime.hooks import request

    return next(h for h in request.HOOKS if h.name == name)


def _config():
    """A real ``VllmConfig`` for a CPU device (vLLM's GPU wheel cannot infer one here)."""
    from vllm.config import DeviceConfig, VllmConfig

    return VllmConfig(device_config=DeviceConfig(device="cpu"))


@pytest.fixture
def prefill_step():
    """A step that starts requests ``a`` and ``b`` (vLLM's real ``SchedulerOutput``)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    step = SchedulerOutput.make_empty()
    step.scheduled_new_reqs = [type("New", (), {"req_id": rid})() for rid in ("a", "b")]
    step.total_num_scheduled_tokens = 100
    return step


def _shipped(part):
    """The notes a step's output carries to EngineCore (vLLM's real ``ModelRunnerOutput``)."""
    from vllm.v1.outputs import ModelRunnerOutput

    from otel_ttft.runtime.hooks.request.payload import WORKER_NOTES_ATTR

    output = part.attach(ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    notes = getattr(output, WORKER_NOTES_ATTR, None)
    return notes.notes if notes is not None else []


def _in_step(hooks, step, *names):
    """These request hooks applied; the worker (its part returned) is inside ``step``."""
    part = hooks(*[_request_hook(n) for n in names]).part("request.worker")
    part.last_step = step
    return part


def test_a_prefill_step_outside_the_graphs_is_noted_with_the_compiled_model(hooks,
                                                                            prefill_step):
    """V1's real ``CudagraphDispatcher``, its keys built for capture sizes up to 16 (the CPU
    platform captures none, so the sizes are set as a GPU's config would have them)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    from otel_ttft.runtime.hooks.request import engine, payload

    part = _in_step(hooks, prefill_step, "request.graph_dispatch")
    config = _config()
    config.compilation_config.cudagraph_capture_sizes = [1, 2, 4, 8, 16]
    config.compilation_config.max_cudagraph_capture_size = 16
    dispatcher = CudagraphDispatcher(config)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.PIECEWISE, 1)

    mode, _ = dispatcher.dispatch(100)
    assert mode == CUDAGraphMode.NONE  # vLLM's own decision, unchanged
    dispatcher.dispatch(8)  # fewer tokens than the step (a logits-only dispatch): not the step's
    (note,) = _shipped(part)
    # the CPU config compiles the model (VLLM_COMPILE): outside every graph is not eager
    choice = payload.GraphChoice("NONE", 100, 16, padded=100, max_piecewise=16, compiled=True)
    assert note == payload.GraphDispatch(choice, ["a", "b"])

    # EngineCore hands it to the requests the step started, and they carry it to the API.
    states = {rid: payload.EnginePayload(1.0, 0, 0, 1, 2) for rid in ("a", "b", "c")}
    core = engine.EngineRequests()
    core.noted.update(states)
    core.charge_notes([note])
    assert states["a"].graph == states["b"].graph == choice
    assert states["c"].graph is None
    assert payload.decode(payload.encode(states["a"])).graph == states["a"].graph


def test_a_prefill_step_inside_the_captured_graphs_is_noted_with_its_mode(hooks, prefill_step):
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    from otel_ttft.runtime.hooks.request import payload

    prefill_step.total_num_scheduled_tokens = 8
    part = _in_step(hooks, prefill_step, "request.graph_dispatch")
    config = _config()
    config.compilation_config.cudagraph_capture_sizes = [1, 2, 4, 8, 16]
    config.compilation_config.max_cudagraph_capture_size = 16
    dispatcher = CudagraphDispatcher(config)
    uninitialized = dispatcher.dispatch(8)  # no graphs captured yet: nothing to note
    assert uninitialized[0] == CUDAGraphMode.NONE and _shipped(part) == []
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.PIECEWISE, 1)
    assert dispatcher.dispatch(8)[0] == CUDAGraphMode.PIECEWISE
    (note,) = _shipped(part)
    assert note.choice == payload.GraphChoice("PIECEWISE", 8, 16, padded=8, max_piecewise=16,
                                              compiled=True)


def test_model_runner_v2s_graph_decision_is_noted(hooks, prefill_step):
    """V2's real ``CudaGraphManager.dispatch`` and ``captured_token_counts``; its constructor
    needs vLLM's distributed groups, so the capture's result (one full decode graph for 8
    tokens, piecewise sizes up to 8) is set on a bare instance (tests/test_graph_capture.py
    builds one through vLLM's constructor and capture)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor, CudaGraphManager

    from otel_ttft.runtime.hooks.request import payload

    part = _in_step(hooks, prefill_step, "request.graph_dispatch_v2")
    manager = object.__new__(CudaGraphManager)
    manager.graphs, manager._candidates, manager._graphs_captured = {}, {}, False
    manager._lora_dispatch_map = {}
    manager.cudagraph_mode = CUDAGraphMode.NONE
    assert manager.dispatch(2, 100, None, 0).cg_mode == CUDAGraphMode.NONE
    assert _shipped(part) == []  # no graphs: an eager server, nothing to say
    config = _config()
    config.compilation_config.cudagraph_capture_sizes = [1, 2, 4, 8]
    manager.compilation_config = config.compilation_config
    manager.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.FULL, num_tokens=8, num_reqs=8,
                                    uniform_token_count=1)
    manager.graphs[desc] = object()
    manager._candidates[(8, 0)] = [desc]
    manager._graphs_captured = True
    assert manager.dispatch(2, 100, None, 0).cg_mode == CUDAGraphMode.NONE
    (note,) = _shipped(part)
    assert (note.choice, note.request_ids) == (
        payload.GraphChoice("NONE", 100, 8, padded=100, max_full=8, max_piecewise=8,
                            compiled=True),
        ["a", "b"])


def _compiled_here(x):
    return (x * 2).sum(-1)


def test_a_compile_and_a_recompile_inside_a_step_are_noted_with_what_compiled(prefill_step):
    """torch's real Dynamo, our callbacks registered through its public handler at the worker's
    first step: a function compiled inside a step is noted with the step's shape, and named
    (Dynamo's record of its compiles) when shipped; the same function for a shape it had not
    seen is a recompile (Dynamo's attempt number). Closed, the callbacks are gone."""
    import torch
    from torch._dynamo.callback import callback_handler

    from otel_ttft.runtime.hooks.request import payload, worker

    torch._dynamo.reset()  # (which drops every callback: vLLM never calls it)
    part = worker.WorkerSteps()
    wrap = worker.wrap_execute_model
    wrap(part, lambda *a: None, type("W", (), {"device": None})(), (prefill_step,), {})
    assert part.last_step is prefill_step
    try:
        fn = torch.compile(_compiled_here, backend="eager", dynamic=False)
        fn(torch.ones(2, 3))
        first, = worker._named(part.notes)
        assert isinstance(first, payload.CompileTime)
        assert first.frame == "test_gpu_paths.py:_compiled_here"
        assert (first.recompile, first.model_graph) == (False, False)
        assert (first.step_tokens, first.step_requests) == (100, 0)  # the step's shape
        assert first.end >= first.start
        fn(torch.ones(5, 3))  # a shape Dynamo had not seen: a guard fails, it compiles again
        _, again = worker._named(part.notes)
        assert again.frame == first.frame and again.recompile is True
        part.notes.clear()
        fn(torch.ones(5, 3))  # compiled for that shape: nothing
        assert part.notes == []
    finally:
        part.close()
    assert part._compile_started not in callback_handler.start_callbacks
    assert part._compile_ended not in callback_handler.end_callbacks


def test_compiles_before_the_first_step_are_start_ups_not_a_requests():
    import torch
    from torch._dynamo.callback import callback_handler

    from otel_ttft.runtime.hooks.request import worker

    part = worker.WorkerSteps()
    before = list(callback_handler.start_callbacks)
    torch._dynamo.reset()
    torch.compile(_compiled_here, backend="eager")(torch.ones(2, 3))
    assert part.notes == [] and callback_handler.start_callbacks == before  # none registered
