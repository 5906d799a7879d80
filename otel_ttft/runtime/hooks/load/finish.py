"""Name the rest of "Load model": what vLLM's loader does around reading and processing weights.

``BaseModelLoader.load_model`` runs two ``gc.collect()`` and two ``empty_cache()`` (post-load
memory release), ``finalize_layerwise_processing`` for online quantization, and ``model.eval()``.
On a small model the collections alone are most of "Load model". The wrappers act only while
vLLM's "Load model" span is the current span (that is: called by the loader itself), so the rest
of the process's ``gc.collect``/``empty_cache``/``eval`` calls pass straight through.
"""

from __future__ import annotations

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks.load.shards import STATE, LoadState
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.semconv import PROCESS_WORKER as WORKER

_LOAD_MODEL = "Load model"
_BASE = "vllm.model_executor.model_loader.base_loader"


def _inside_load_model() -> bool:
    return getattr(trace.get_current_span(), "name", None) == _LOAD_MODEL


def _timed(name: str, stage: str, call_name: str | None = None):
    def wrapper(load: LoadState, call, instance, args, kwargs):
        if not _inside_load_model():
            return call(*args, **kwargs)
        attrs = {semconv.ATTR_LOAD_RELEASE_CALL: call_name} if call_name else None
        with load.stage_span(name, stage, attributes=attrs):
            return call(*args, **kwargs)

    return wrapper


GC_COLLECT = Hook("load.release_gc", "gc:collect",
                  _timed(semconv.SPAN_RELEASE_MEMORY, semconv.STAGE_LOAD, "gc.collect"),
                  stage=semconv.STAGE_LOAD, process=WORKER, state=STATE)
EMPTY_CACHE = Hook("load.release_cache", "torch.accelerator:empty_cache",
                   _timed(semconv.SPAN_RELEASE_MEMORY, semconv.STAGE_LOAD, "empty_cache"),
                   stage=semconv.STAGE_LOAD, process=WORKER, state=STATE)
FINALIZE = Hook("load.finalize_layerwise",
                f"{_BASE}:finalize_layerwise_processing",
                _timed(semconv.SPAN_FINALIZE_LAYERWISE, semconv.STAGE_LOAD_PROCESS),
                stage=semconv.STAGE_LOAD_PROCESS, process=WORKER, state=STATE)
# Online-quantization logging: a config check, whose first call imports vLLM's online
# quantization package (~0.2 s inside "Load model" on the first engine of a process).
QUANT_LOG = Hook("load.online_quant_check", f"{_BASE}:log_online_quantization",
                 _timed(semconv.SPAN_ONLINE_QUANT_CHECK, semconv.STAGE_LOAD),
                 stage=semconv.STAGE_LOAD, process=WORKER, state=STATE)
QUANT_TIME_LOG = Hook("load.online_quant_time", f"{_BASE}:log_online_quantization_time",
                      _timed(semconv.SPAN_ONLINE_QUANT_CHECK, semconv.STAGE_LOAD),
                      stage=semconv.STAGE_LOAD, process=WORKER, state=STATE)
MODEL_EVAL = Hook("load.model_eval", "torch.nn.modules.module:Module.eval",
                  _timed(semconv.SPAN_MODEL_EVAL, semconv.STAGE_LOAD),
                  stage=semconv.STAGE_LOAD, process=WORKER, state=STATE)

HOOKS = [GC_COLLECT, EMPTY_CACHE, FINALIZE, QUANT_LOG, QUANT_TIME_LOG, MODEL_EVAL]
