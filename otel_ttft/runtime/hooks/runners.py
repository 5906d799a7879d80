"""Every model runner vLLM can build gets the same start-up stages, and says which it is.

vLLM's worker builds one runner (``Worker._make_model_runner``, ``CPUWorker.init_device``,
``XPUWorker._make_model_runner``): V1 (``gpu_model_runner.GPUModelRunner`` and its CPU and XPU
subclasses) or, when ``VllmConfig.use_v2_model_runner`` is true, Model Runner V2
(``gpu.model_runner.GPUModelRunner``: the GPU default, not a subclass of V1; its CPU, XPU and
multimodal encoder-only subclasses). V1 opens "Loading (GPU)" and "Capture model" itself; V2 opens
neither, so its hooks open them under the same names, and the analysis sees the same stages
whichever runner ran. The stage spans carry ``ttft.model_runner`` and ``ttft.model_runner.reason``.

``RUNNERS`` is data, read by the hooks and by ``otel-ttft doctor``: which runner each platform's
worker builds, and which hook measures each stage on it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_WORKER as WORKER

V1 = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
MM_ENCODER = "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner"
_LOADER = "vllm.model_executor.model_loader.base_loader:BaseModelLoader"

# Hook names per stage (the hooks themselves: warmup.py and below).
PROFILE_GPU, PROFILE_CPU = "warmup.profile_gpu", "warmup.profile_cpu"
KV_V1, KV_V2 = "warmup.kv_alloc", "warmup.kv_alloc_v2"
GRAPHS_V1, GRAPHS_V2, GRAPHS_MM = ("warmup.graph_capture", "warmup.graph_capture_v2",
                                   "warmup.graph_capture_mm_encoder")
LOAD_V1, LOAD_V2 = "load.runner", "load.runner_v2"
#: V1 runners ask ``CudagraphDispatcher``, V2 runners ``CudaGraphManager`` (``request.worker``)
DISPATCH_V1, DISPATCH_V2 = "request.graph_dispatch", "request.graph_dispatch_v2"
#: V2's graph manager: its ``capture`` is where each shape's mode is seen (``hooks.capture``)
V2_GRAPHS = "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager"
GRAPH_SHAPES_V2 = "warmup.graph_capture_v2_shapes"


@dataclass(frozen=True)
class Runner:
    """One model runner vLLM builds: on which platforms' workers (``current_platform.
    device_type``), on which choice, and the hook that measures each stage on it (``None``: the
    stage does not happen there, e.g. no CUDA graphs on a CPU)."""

    target: str  # "module:Class"
    platforms: tuple[str, ...]
    v2: bool
    mm_encoder_only: bool = False
    stages: Mapping[str, str | None] = field(default_factory=dict)
    #: the hook on the CUDA-graph dispatcher this runner asks each step (``None``: no graphs)
    graph_decision: str | None = None

    @property
    def class_path(self) -> str:
        return self.target.replace(":", ".")


def _stages(load: str, profile: str, kv: str, graphs: str | None) -> dict[str, str | None]:
    return {semconv.STAGE_LOAD: load, semconv.STAGE_WARMUP_PROFILE: profile,
            semconv.STAGE_WARMUP_KV_ALLOC: kv, semconv.STAGE_WARMUP_GRAPH_CAPTURE: graphs}


_GPU = ("cuda",)  # CUDA and ROCm both report device_type "cuda"; their worker is gpu_worker.Worker
RUNNERS: tuple[Runner, ...] = (
    Runner(V1, _GPU, v2=False, stages=_stages(LOAD_V1, PROFILE_GPU, KV_V1, GRAPHS_V1),
           graph_decision=DISPATCH_V1),
    Runner(V2, _GPU, v2=True, stages=_stages(LOAD_V2, PROFILE_GPU, KV_V2, GRAPHS_V2),
           graph_decision=DISPATCH_V2),
    Runner(MM_ENCODER, _GPU, v2=True, mm_encoder_only=True,
           stages=_stages(LOAD_V2, PROFILE_GPU, KV_V2, GRAPHS_MM)),
    Runner("vllm.v1.worker.cpu_model_runner:CPUModelRunner", ("cpu",), v2=False,
           stages=_stages(LOAD_V1, PROFILE_CPU, KV_V1, None)),
    Runner("vllm.v1.worker.cpu.model_runner:CPUModelRunner", ("cpu",), v2=True,
           stages=_stages(LOAD_V2, PROFILE_CPU, KV_V2, None)),
    Runner("vllm.v1.worker.xpu_model_runner:XPUModelRunner", ("xpu",), v2=False,
           stages=_stages(LOAD_V1, PROFILE_GPU, KV_V1, GRAPHS_V1), graph_decision=DISPATCH_V1),
    Runner("vllm.v1.worker.xpu_model_runner:XPUModelRunnerV2", ("xpu",), v2=True,
           stages=_stages(LOAD_V2, PROFILE_GPU, KV_V2, GRAPHS_V2), graph_decision=DISPATCH_V2),
    Runner("vllm.v1.worker.xpu_model_runner:XPUMMEncoderModelRunner", ("xpu",), v2=True,
           mm_encoder_only=True, stages=_stages(LOAD_V2, PROFILE_GPU, KV_V2, GRAPHS_MM)),
)


def runner_for(device_type: str, v2: bool, mm_encoder_only: bool = False) -> Runner | None:
    """The runner a worker on ``device_type`` builds for that choice (as ``_make_model_runner``);
    the encoder-only variant exists only for V2."""
    for runner in RUNNERS:
        if (device_type in runner.platforms and runner.v2 == v2
                and runner.mm_encoder_only == (mm_encoder_only and v2)):
            return runner
    return None


def choice_reason(vllm_config: Any, *, use_v2: bool | None = None, triton: bool | None = None,
                  unsupported: Sequence[str] | None = None) -> str:
    """Why vLLM builds V2 or V1 for this config, in the order and words of its own
    ``VllmConfig.use_v2_model_runner``, whose answer this explains, never re-derives: its answer,
    the configs that require V2, ``VLLM_USE_V2_MODEL_RUNNER``, whether vLLM found Triton usable
    (``vllm.triton_utils.HAS_TRITON``, read only) and, where a tool read them, the features V2
    lacks. ``use_v2``/``triton``/``unsupported``: what a tool computed for another host."""
    from vllm import envs

    if use_v2 is None:
        use_v2 = bool(vllm_config.use_v2_model_runner)
    attention = getattr(vllm_config, "attention_config", None)
    if getattr(attention, "hisparse_config", None) is not None:
        return "HiSparse requires Model Runner V2"
    if getattr(vllm_config, "watermark_config", None) is not None:
        return "watermarking requires Model Runner V2"
    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is not None:
        return f"VLLM_USE_V2_MODEL_RUNNER={int(bool(forced))}"
    if use_v2:
        return "default: Model Runner V2 (Triton usable, no feature it lacks)"
    if triton is None:
        triton = bool(getattr(sys.modules.get("vllm.triton_utils"), "HAS_TRITON", True))
    if not triton:
        return "Model Runner V2 requires Triton, not usable here: the V1 model runner"
    if unsupported:
        return f"Model Runner V2 does not yet support {', '.join(unsupported)}: the V1 model runner"
    return ("Model Runner V2 does not yet support a feature of this config (vLLM's warning names "
            "it): the V1 model runner")


def _reason_or_none(vllm_config: Any) -> str | None:
    try:
        return choice_reason(vllm_config)
    except Exception:  # noqa: BLE001 - a label must never cost the stage its span
        return None


def runner_attributes(runner: Any) -> dict[str, Any]:
    """``ttft.model_runner`` (the class that ran) and why vLLM chose it, for a stage span."""
    if runner is None:
        return {}
    cls = type(runner)
    attrs = {semconv.ATTR_MODEL_RUNNER: f"{cls.__module__}.{cls.__qualname__}"}
    reason = _reason_or_none(getattr(runner, "vllm_config", None))
    if reason is not None:
        attrs[semconv.ATTR_MODEL_RUNNER_REASON] = reason
    return attrs


def chosen_attributes(vllm_config: Any) -> dict[str, Any]:
    """The same, where only the config is at hand (inside the loader): the runner this
    platform's worker builds for it."""
    from vllm.platforms import current_platform

    runner = runner_for(current_platform.device_type, bool(vllm_config.use_v2_model_runner),
                        bool(getattr(vllm_config, "is_mm_encoder_only", False)))
    reason = _reason_or_none(vllm_config)
    if runner is None or reason is None:
        return {}
    return {semconv.ATTR_MODEL_RUNNER: runner.class_path,
            semconv.ATTR_MODEL_RUNNER_REASON: reason}


def _loading_span_name(runner: Any) -> str:
    device = getattr(getattr(runner, "device", None), "type", None)
    return semconv.SPAN_LOADING_CPU if device == "cpu" else semconv.SPAN_LOADING_GPU


def _wrap_load_v2(warmup, call, instance, args, kwargs):
    """V2's ``load_model`` has no span of vLLM's: ours, under V1's name for this device."""
    name = _loading_span_name(instance)
    with spans.stage_span(name, semconv.STAGE_LOAD, enrich=name,
                          attributes=runner_attributes(instance), tracer=warmup.tracer,
                          identity=warmup.identity):
        return call(*args, **kwargs)


def _wrap_loader_load_model(call, instance, args, kwargs):
    """Names the runner on V1's "Loading (GPU|CPU)", which vLLM opens inside ``load_model``,
    where no wrapper of ours reaches: the loader is the first call of ours inside it."""
    span = trace.get_current_span()
    if (span.is_recording()
            and getattr(span, "name", None) in (semconv.SPAN_LOADING_GPU, semconv.SPAN_LOADING_CPU)
            and semconv.ATTR_MODEL_RUNNER not in (getattr(span, "attributes", None) or {})):
        config = kwargs.get("vllm_config", args[0] if args else None)
        if config is not None:
            span.set_attributes(chosen_attributes(config))
    return call(*args, **kwargs)


LOAD_RUNNER = Hook(LOAD_V1, f"{_LOADER}.load_model", _wrap_loader_load_model,
                   stage=semconv.STAGE_LOAD, process=WORKER)
# the spans of these go to the warm-up part's tracer (``hooks.warmup.PART``, which imports us)
_WARMUP = "warmup"
LOAD_RUNNER_V2 = Hook(LOAD_V2, f"{V2}.load_model", _wrap_load_v2, stage=semconv.STAGE_LOAD,
                      process=WORKER, state=_WARMUP)
# the graph-capture hooks (V1's, V2's, the encoder-only runner's): ``hooks.capture``
HOOKS = [LOAD_RUNNER, LOAD_RUNNER_V2]
