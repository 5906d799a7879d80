"""``warmup``: device-context creation, profile run, torch.compile, graph capture, KV allocation.

Where vLLM already opens the span ("Allocate KV cache", "Capture model", "Init device" on GPU) we
hook a call *inside* it and add our numbers to that span; where it opens none (device init on CPU,
the profile run, torch.compile) we open ours.
"""

from __future__ import annotations

import contextlib
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import capture, runners
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.runtime.hooks.request import worker as request_worker
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_WORKER as WORKER


def _wrap_device_init(warmup, call, instance, args, kwargs):
    attrs = {semconv.ATTR_DEVICE_TYPE: "cpu", semconv.ATTR_DEVICE_NAME: _cpu_model()}
    with spans.stage_span(semconv.SPAN_DEVICE_INIT, semconv.STAGE_WARMUP_DEVICE_INIT,
                          enrich="Init device", attributes=attrs, tracer=warmup.tracer,
                          identity=warmup.identity):
        return call(*args, **kwargs)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or None


def _wrap_profile_run(warmup, call, instance, args, kwargs):
    attrs = {**_memory_attributes(),
             **runners.runner_attributes(getattr(instance, "model_runner", None))}
    with spans.stage_span(semconv.SPAN_PROFILE_RUN, semconv.STAGE_WARMUP_PROFILE,
                          attributes=attrs, tracer=warmup.tracer,
                          identity=warmup.identity) as span:
        available = call(*args, **kwargs)
        if isinstance(available, int):
            span.set_attribute(semconv.ATTR_PROFILE_AVAILABLE_KV_BYTES, available)
        return available


def _memory_attributes() -> dict[str, Any]:
    """Device and host memory totals: what `otel-ttft analyze` judges "both models fit" and
    the sleep level by."""
    import os

    attrs: dict[str, Any] = {}
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        attrs[semconv.ATTR_HOST_MEMORY_BYTES] = int(host)
        attrs[semconv.ATTR_DEVICE_MEMORY_BYTES] = int(host)
        attrs[semconv.ATTR_DEVICE_TYPE] = "cpu"
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            attrs[semconv.ATTR_DEVICE_MEMORY_BYTES] = int(torch.cuda.mem_get_info()[1])
            attrs[semconv.ATTR_DEVICE_TYPE] = "cuda"
    except Exception:  # noqa: BLE001 - a probe must never fail the profile run
        pass
    return attrs


def _compilation_counter():
    from vllm.compilation.counter import compilation_counter

    return compilation_counter


def _compile_attributes(vllm_config: Any) -> dict[str, Any]:
    cc = getattr(vllm_config, "compilation_config", None)
    if cc is None:
        return {}
    ranges = getattr(cc, "compile_ranges_endpoints", None) or getattr(cc, "compile_sizes", None)
    return {
        semconv.ATTR_COMPILE_MODE: str(getattr(cc, "mode", "")),
        semconv.ATTR_COMPILE_CACHE_DIR: getattr(cc, "local_cache_dir", None) or
        getattr(cc, "cache_dir", None) or None,
        semconv.ATTR_COMPILE_RANGES: [str(r) for r in ranges] if ranges else None,
    }


@contextlib.contextmanager
def _traced_compile(warmup, inner_cm, vllm_config: Any, aot_probe: bool):
    """vLLM's own ``monitor_torch_compile`` inside our span. vLLM enters this outside any
    guard of ours, so a failure of ours (opening the span, reading the counters) is reported
    and the compile runs as it would have; vLLM's own errors pass through as they are."""
    with contextlib.ExitStack() as ours:
        span = counter = before = None
        try:
            counter = _compilation_counter()
            before = counter.clone()
            span = ours.enter_context(spans.stage_span(
                semconv.SPAN_TORCH_COMPILE, semconv.STAGE_WARMUP_COMPILE,
                attributes=_compile_attributes(vllm_config), tracer=warmup.tracer,
                identity=warmup.identity))
        except Exception as exc:  # noqa: BLE001 - ours must not fail the compile
            report_failure(COMPILE, exc)
        try:
            with inner_cm:
                yield
        finally:  # a failed AOT-cache load is a miss worth seeing, so record it too
            if span is not None:
                try:
                    span.set_attributes(_compile_outcome(counter, before, aot_probe))
                except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the compile
                    report_failure(COMPILE, exc)


def _compile_outcome(counter: Any, before: Any, aot_probe: bool) -> dict[str, Any]:
    loaded = counter.num_aot_artifacts_loaded - before.num_aot_artifacts_loaded
    loaded += counter.num_compiled_artifacts_loaded - before.num_compiled_artifacts_loaded
    compiled = counter.num_backend_compilations - before.num_backend_compilations
    compiled += counter.num_aot_compiles - before.num_aot_compiles
    return {
        semconv.ATTR_COMPILE_CACHE_HIT: bool(loaded) and not compiled,
        semconv.ATTR_COMPILE_GRAPHS: compiled,
        semconv.ATTR_COMPILE_AOT_LOAD_ATTEMPT: aot_probe,
    }


class Warmup:
    """The ``warmup`` part: the tracer its spans go to, the compiled modules whose AOT-cache
    load attempt was a stage already (``probed_tags``), the graph capture under way."""

    def __init__(self, process_state: Any) -> None:
        self.tracer = process_state.tracer
        self.identity = process_state.identity
        self.probed_tags: set[str] = set()
        #: the open "Capture model" span's captures, per mode (``hooks.capture``)
        self.graphs: capture.GraphTally | None = None


PART = "warmup"


def _wrap_monitor_torch_compile(warmup: Warmup, call, instance, args, kwargs):
    """``monitor_torch_compile`` brackets every compile and every AOT-cache load attempt.

    Only the first load attempt per compiled module is a stage: when warm-up was skipped
    (``VLLM_CPU_CI_ENV=1``) vLLM repeats the probe on every forward, and a span per step would
    flood the trace and tax the hot path.

    During start-up a span is current and the compile gets its own span; inside a request's
    step it gets none (no orphan worker span): the request path times that compile from
    Dynamo's callbacks (``request.worker``) and shows it in the trees of the requests that
    waited on it.
    """
    inner = call(*args, **kwargs)
    aot_probe = kwargs.get("announce_start") is False
    if not trace.get_current_span().get_span_context().is_valid:
        # a step of some request (start-up's compiles run under the profile run); the AOT probe
        # is not a compile
        return inner if aot_probe else request_worker.model_compile(inner)
    if aot_probe:
        tag = str(kwargs.get("tag", ""))
        if tag in warmup.probed_tags:
            return inner
        warmup.probed_tags.add(tag)
    vllm_config = args[0] if args else kwargs.get("vllm_config")
    return _traced_compile(warmup, inner, vllm_config, aot_probe=aot_probe)


def _kv_cache_attributes(kv_cache_config: Any) -> dict[str, Any]:
    num_blocks = int(kv_cache_config.num_blocks)
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    block_size = int(groups[0].kv_cache_spec.block_size) if groups else None
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None) or []
    return {
        semconv.ATTR_KV_BLOCKS: num_blocks,
        semconv.ATTR_KV_BLOCK_SIZE: block_size,
        semconv.ATTR_KV_BYTES: sum(int(t.size) for t in tensors),
        semconv.ATTR_KV_TOKEN_CAPACITY: num_blocks * block_size if block_size else None,
    }


def _wrap_initialize_kv_cache(warmup, call, instance, args, kwargs):
    """V1's and V2's ``initialize_kv_cache`` (one signature) run inside vLLM's "Allocate KV
    cache" (the worker opens it): our numbers on it, or our span of that name where it is not
    open. Profiling's minimal KV cache (``is_profiling``) is not the stage."""
    kv_cache_config = args[0] if args else kwargs.get("kv_cache_config")
    if kwargs.get("is_profiling") or (len(args) > 1 and args[1]):
        return call(*args, **kwargs)
    with spans.stage_span(semconv.SPAN_KV_ALLOC, semconv.STAGE_WARMUP_KV_ALLOC,
                          enrich="Allocate KV cache",
                          attributes={**_kv_cache_attributes(kv_cache_config),
                                      **runners.runner_attributes(instance)},
                          tracer=warmup.tracer, identity=warmup.identity):
        return call(*args, **kwargs)


DEVICE_INIT_CPU = Hook("warmup.device_init_cpu", "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
                       _wrap_device_init, stage=semconv.STAGE_WARMUP_DEVICE_INIT,
                       process=WORKER, optional=True, state=PART)
PROFILE_GPU = Hook(runners.PROFILE_GPU,
                   "vllm.v1.worker.gpu_worker:Worker.determine_available_memory",
                   _wrap_profile_run, stage=semconv.STAGE_WARMUP_PROFILE, process=WORKER,
                   state=PART)
PROFILE_CPU = Hook(runners.PROFILE_CPU,
                   "vllm.v1.worker.cpu_worker:CPUWorker.determine_available_memory",
                   _wrap_profile_run, stage=semconv.STAGE_WARMUP_PROFILE, process=WORKER,
                   optional=True, state=PART)
COMPILE = Hook("warmup.compile", "vllm.compilation.decorators:monitor_torch_compile",
               _wrap_monitor_torch_compile, stage=semconv.STAGE_WARMUP_COMPILE, process=WORKER,
               state=PART)
KV_ALLOC = Hook(runners.KV_V1, f"{runners.V1}.initialize_kv_cache",
                _wrap_initialize_kv_cache, stage=semconv.STAGE_WARMUP_KV_ALLOC, process=WORKER,
                state=PART)
KV_ALLOC_V2 = Hook(runners.KV_V2, f"{runners.V2}.initialize_kv_cache",
                   _wrap_initialize_kv_cache, stage=semconv.STAGE_WARMUP_KV_ALLOC, process=WORKER,
                state=PART)
GRAPH_CAPTURE = capture.GRAPH_CAPTURE  # V1's (the others: ``capture.HOOKS``)

HOOKS = [DEVICE_INIT_CPU, PROFILE_GPU, PROFILE_CPU, COMPILE, KV_ALLOC, KV_ALLOC_V2,
         *capture.HOOKS, *runners.HOOKS]
