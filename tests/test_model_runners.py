"""Every model runner vLLM can build, on vLLM's real classes: each stage's hook target exists
with the signature its wrapper reads, V2's graph-capture and KV-allocation hooks wrap V2's real
methods with V1's span and stage names, the runner table matches vLLM's own ``_make_model_runner``,
and the wrappers run around the real methods (where one runs without CUDA, it runs; where it
cannot, vLLM's error passes through and the span is still right)."""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import pytest
import torch
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import all_hooks, capture, runners, warmup
from otel_ttft.runtime.hooks.registry import resolve

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

V1_PATH = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
V2_PATH = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"


def _class(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _hook(name: str):
    return next(h for h in all_hooks() if h.name == name)


def _finished(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _bare(cls: type, **attrs):
    """A real instance of a vLLM runner without its ``__init__`` (a full config and a device)."""
    runner = object.__new__(cls)
    for key, value in attrs.items():
        setattr(runner, key, value)
    return runner


@pytest.mark.parametrize("runner", runners.RUNNERS, ids=lambda r: r.target)
def test_every_stage_of_every_runner_has_a_live_hook_on_it(runner):
    cls = _class(runner.target)
    assert set(runner.stages) == {semconv.STAGE_LOAD, semconv.STAGE_WARMUP_PROFILE,
                                  semconv.STAGE_WARMUP_KV_ALLOC,
                                  semconv.STAGE_WARMUP_GRAPH_CAPTURE}
    for stage, name in runner.stages.items():
        if name is None:
            continue
        hook = _hook(name)
        assert hook.stage == stage
        assert resolve(hook) == (True, "ok"), hook.target
        module, _, qualname = hook.target.partition(":")
        owner = getattr(importlib.import_module(module), qualname.rsplit(".", 1)[0])
        if "model_runner" in module:  # a runner method: this runner must inherit it
            assert owner in cls.__mro__, (runner.target, hook.target)


@pytest.mark.parametrize("runner", runners.RUNNERS, ids=lambda r: r.target)
def test_each_runner_with_cuda_graphs_has_its_dispatchers_hook(runner):
    """V1 runners ask ``CudagraphDispatcher``, V2 runners ``CudaGraphManager``; a runner that
    captures graphs through neither (CPU, encoder-only) has no decision to note."""
    if runner.stages[semconv.STAGE_WARMUP_GRAPH_CAPTURE] is None or runner.mm_encoder_only:
        assert runner.graph_decision is None
        return
    assert runner.graph_decision == (runners.DISPATCH_V2 if runner.v2 else runners.DISPATCH_V1)
    hook = _hook(runner.graph_decision)
    assert resolve(hook) == (True, "ok"), hook.target


def _parameters(target: str) -> list[str]:
    module, _, qualname = target.partition(":")
    owner, attr = qualname.rsplit(".", 1)
    fn = vars(getattr(importlib.import_module(module), owner))[attr]
    return list(inspect.signature(inspect.unwrap(fn)).parameters)


def test_each_wrapped_method_has_the_signature_its_wrapper_reads():
    for name in (runners.KV_V1, runners.KV_V2):  # kv_cache_config first, is_profiling second
        assert _parameters(_hook(name).target)[1:3] == ["kv_cache_config", "is_profiling"]
    assert _parameters(_hook(runners.GRAPHS_V1).target)[1] == "batch_descriptors"
    for name in (runners.GRAPHS_V2, runners.GRAPHS_MM):  # profile_only, keyword only
        module, _, qualname = _hook(name).target.partition(":")
        owner, attr = qualname.rsplit(".", 1)
        fn = inspect.unwrap(vars(getattr(importlib.import_module(module), owner))[attr])
        param = inspect.signature(fn).parameters["profile_only"]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
    assert _parameters(_hook(runners.LOAD_V1).target)[1] == "vllm_config"
    for name in (runners.PROFILE_GPU, runners.PROFILE_CPU):
        assert _parameters(_hook(name).target) == ["self"]


def test_the_runner_table_is_what_vllms_make_model_runner_builds(monkeypatch):
    """``Worker._make_model_runner`` (and XPU's), run for real with the classes it would build
    replaced by recorders: the class it picks is the one ``runners.runner_for`` names."""
    from vllm.v1.worker import gpu_worker, xpu_worker

    built: list[str] = []

    def recorder(path):
        return lambda *args, **kwargs: built.append(path)

    for runner in runners.RUNNERS:
        module, _, name = runner.target.partition(":")
        monkeypatch.setattr(importlib.import_module(module), name, recorder(runner.class_path))
        if module == "vllm.v1.worker.xpu_model_runner":  # xpu_worker imports them by name
            monkeypatch.setattr(xpu_worker, name, recorder(runner.class_path))
    for device, worker in (("cuda", gpu_worker.Worker), ("xpu", xpu_worker.XPUWorker)):
        for v2 in (False, True):
            for mm in (False, True):
                built.clear()
                stand_in = SimpleNamespace(use_v2_model_runner=v2, device=None,
                                           vllm_config=SimpleNamespace(is_mm_encoder_only=mm))
                worker._make_model_runner(stand_in)
                assert built == [runners.runner_for(device, v2, mm).class_path], (device, v2, mm)


def test_v2_kv_allocation_has_v1s_span_stage_and_numbers(exporter, hooks):
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    hooks(warmup.KV_ALLOC, warmup.KV_ALLOC_V2)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=10, kv_cache_tensors=[
        KVCacheTensor(size=4096, layers=["l0"], layer_stride=0, block_stride=0)],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    for cls in (V1, V2):
        # vLLM's real method needs the runner __init__ built; on a bare one it fails at once,
        # and that error passes through unchanged.
        with pytest.raises(AttributeError):
            cls.initialize_kv_cache(_bare(cls), config)
        with pytest.raises(AttributeError):  # the profiling pass is not the stage
            cls.initialize_kv_cache(_bare(cls), config, is_profiling=True)
    v1, v2 = _finished(exporter, semconv.SPAN_KV_ALLOC)
    for span, path in ((v1, V1_PATH), (v2, V2_PATH)):
        assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_KV_ALLOC
        assert span.attributes[semconv.ATTR_KV_BLOCKS] == 10
        assert span.attributes[semconv.ATTR_KV_TOKEN_CAPACITY] == 160
        assert span.attributes[semconv.ATTR_KV_BYTES] == 4096
        assert span.attributes[semconv.ATTR_MODEL_RUNNER] == path
        assert span.events[0].name == "exception"


def test_v2_kv_allocation_enriches_vllms_span_when_open(exporter, hooks):
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    hooks(warmup.KV_ALLOC_V2)
    with (trace.get_tracer("vllm").start_as_current_span(semconv.SPAN_KV_ALLOC),
          pytest.raises(AttributeError)):
        V2.initialize_kv_cache(_bare(V2), KVCacheConfig(0, [], []))
    (span,) = _finished(exporter, semconv.SPAN_KV_ALLOC)  # vLLM's, not a second one
    assert span.instrumentation_scope.name == "vllm"
    assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_KV_ALLOC
    assert span.attributes[semconv.ATTR_MODEL_RUNNER] == V2_PATH


class _NoGraphs:
    """V2's graph manager when nothing is left to capture (a CUDA graph needs a GPU)."""

    def needs_capture(self) -> bool:
        return False

    def captured_token_counts(self) -> list[int]:
        return []


def test_v2_graph_capture_runs_vllms_method_under_v1s_span_and_stage(exporter, hooks):
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    hooks(warmup.GRAPH_CAPTURE, capture.GRAPH_CAPTURE_V2)
    with trace.get_tracer("vllm").start_as_current_span("Capture model"):  # vLLM's, on V1
        V1._capture_cudagraphs(_bare(V1), [], CUDAGraphMode.FULL)
    v2 = _bare(V2, cudagraph_manager=_NoGraphs(),
               model_state=SimpleNamespace(supports_mm_inputs=False))
    # vLLM's real capture_model: nothing to capture, so it returns 0 bytes before any CUDA call.
    assert V2.capture_model(v2) == 0
    assert V2.capture_model(v2, profile_only=True) == 0  # a memory estimate: no span
    v1_span, v2_span = _finished(exporter, semconv.SPAN_GRAPH_CAPTURE)
    assert v1_span.name == v2_span.name
    for span, path in ((v1_span, V1_PATH), (v2_span, V2_PATH)):
        assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_GRAPH_CAPTURE
        assert span.attributes[semconv.ATTR_GRAPH_COUNT] == 0
        assert list(span.attributes[semconv.ATTR_GRAPH_BATCH_SIZES]) == []
        assert span.attributes[semconv.ATTR_MODEL_RUNNER] == path
    assert v2_span.attributes[semconv.ATTR_GRAPH_MEMORY_BYTES] == 0
    with pytest.raises(AssertionError):  # vLLM's own check, unchanged under our span
        V2.capture_model(_bare(V2, cudagraph_manager=None))


def test_encoder_only_graph_capture_runs_vllms_method(exporter, hooks):
    from vllm.v1.worker.mm_encoder_model_runner import MMEncoderModelRunner

    hooks(capture.GRAPH_CAPTURE_MM)
    encoder = SimpleNamespace(has_cudagraph=lambda: False)
    runner = _bare(MMEncoderModelRunner, model_state=SimpleNamespace(encoder_runner=encoder))
    assert MMEncoderModelRunner.capture_model(runner) == 0
    (span,) = _finished(exporter, semconv.SPAN_GRAPH_CAPTURE)
    assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_GRAPH_CAPTURE
    assert span.attributes[semconv.ATTR_MODEL_RUNNER] == \
        "vllm.v1.worker.mm_encoder_model_runner.MMEncoderModelRunner"


@pytest.mark.parametrize(("device", "name"), [(torch.device("cpu"), semconv.SPAN_LOADING_CPU),
                                              (None, semconv.SPAN_LOADING_GPU)])
def test_v2_load_opens_v1s_loading_span(exporter, hooks, device, name):
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUV2
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    hooks(runners.LOAD_RUNNER_V2)
    cls = CPUV2 if device is not None else V2
    with pytest.raises(AttributeError):  # the real load_model, on a runner never built
        cls.load_model(_bare(cls, device=device))
    (span,) = _finished(exporter, name)
    assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD
    assert span.attributes[semconv.ATTR_MODEL_RUNNER] == f"{cls.__module__}.{cls.__qualname__}"


def test_v1_loading_span_is_named_from_inside_by_the_loader(exporter, hooks):
    """V1 opens "Loading (CPU|GPU)" inside ``load_model``; the loader, called inside it, names
    the runner this host's worker builds for the config, by vLLM's own choice."""
    from vllm.config import LoadConfig, VllmConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.platforms import current_platform

    hooks(runners.LOAD_RUNNER)
    if current_platform.device_type == "cpu":  # the CPU build: V1's CPU runner without Triton
        config = VllmConfig()
        expected = ("vllm.v1.worker.cpu_model_runner.CPUModelRunner"
                    if not config.use_v2_model_runner
                    else "vllm.v1.worker.cpu.model_runner.CPUModelRunner")
    else:  # a GPU build on a machine without a GPU: no platform, no runner to name
        pytest.skip(f"no model runner on platform {current_platform.device_type!r}")
    with (trace.get_tracer("vllm").start_as_current_span(semconv.SPAN_LOADING_CPU),
          pytest.raises(AttributeError)):
        # no model config: vLLM's loader fails at once, after ours named the runner
        DefaultModelLoader(LoadConfig()).load_model(vllm_config=config, model_config=None)
    (span,) = _finished(exporter, semconv.SPAN_LOADING_CPU)
    assert span.attributes[semconv.ATTR_MODEL_RUNNER] == expected
    assert span.attributes[semconv.ATTR_MODEL_RUNNER_REASON] == runners.choice_reason(config)


def test_choice_reason_follows_vllms_own_answer(monkeypatch):
    import vllm.config.vllm as config_module
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    from otel_ttft.tools.runner_choice import decide_v2

    if current_platform.device_type == "cpu" and not HAS_TRITON:  # no CPU backend for Triton
        assert VllmConfig().use_v2_model_runner is False
        assert "requires Triton" in runners.choice_reason(VllmConfig())

    def gpu_config():  # vLLM infers no device without a platform (a GPU build on a CPU host)
        if current_platform.device_type:
            return VllmConfig()
        return VllmConfig(device_config=DeviceConfig(device="cuda"))

    before = vars(config_module)["HAS_TRITON"]
    config = gpu_config()
    # vLLM's own decision, as on a GPU host where Triton sees the driver, and as where it does not
    assert decide_v2(config, True) is True
    assert runners.choice_reason(config, use_v2=True, triton=True).startswith(
        "default: Model Runner V2")
    assert decide_v2(config, False) is False
    assert "requires Triton" in runners.choice_reason(config, use_v2=False, triton=False)
    assert runners.choice_reason(config, use_v2=False, triton=True, unsupported=["x y"]) == (
        "Model Runner V2 does not yet support x y: the V1 model runner")
    for value, v2 in (("1", True), ("0", False)):
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
        assert decide_v2(config, True) is v2 and decide_v2(config, False) is v2
        assert runners.choice_reason(config, use_v2=v2, triton=True) == (
            f"VLLM_USE_V2_MODEL_RUNNER={value}")
    assert vars(config_module)["HAS_TRITON"] is before  # vLLM's module as it was
