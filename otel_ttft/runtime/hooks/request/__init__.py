"""The request path: one span per request whose stage children tile its server-side TTFT, built
after the fact from timestamps vLLM already records (``docs/architecture.md`` walks one request).

One part per process, handed to the hooks that name it: ``request.api`` (``api``: the records,
emitted by ``settle`` through ``spans``, ``attributes`` and ``metrics`` as ``detail`` decides),
``request.engine`` (``engine``: counts, never spans) and ``request.worker`` (``worker``, with
``graphs`` and ``kernels``); what they hand each other, one way in each direction, is
``payload``.
"""

from __future__ import annotations

import functools

from otel_ttft import semconv
from otel_ttft.runtime.hooks import activation
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.runtime.hooks.request import api, engine, graphs, worker
from otel_ttft.runtime.state import PartSpec

API_SERVER, ENGINE_CORE, WORKER = semconv.PROCESS_KINDS
API, ENGINE, WORKER_PART = "request.api", "request.engine", "request.worker"  # the parts
_OP = "vllm.v1.engine.output_processor:OutputProcessor"
_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
# every platform's worker (CPUWorker, XPUWorker) inherits these two from the GPU Worker
_WORKER = "vllm.v1.worker.gpu_worker:Worker"
_ASYNC_OUTPUTS = (
    ("v1", "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput"),
    ("v1_pooling", "vllm.v1.worker.gpu_model_runner:AsyncGPUPoolingModelRunnerOutput"),
    ("v2", "vllm.v1.worker.gpu.async_utils:AsyncOutput"),
    ("v2_pooling", "vllm.v1.worker.gpu.async_utils:AsyncPoolingOutput"),
)
HOOKS: list[Hook] = [
    Hook("request.flush", "starlette.responses:StreamingResponse.stream_response",
         api.wrap_stream_response, stage=semconv.STAGE_FRONTEND, process=API_SERVER,
         optional=True),
    Hook("request.caller", "vllm.v1.engine.async_llm:AsyncLLM.add_request",
         api.wrap_engine_add_request, process=API_SERVER),
    Hook("request.add", f"{_OP}.add_request", api.wrap_add_request, process=API_SERVER,
         state=API),
    Hook("request.generate", "vllm.v1.engine.async_llm:AsyncLLM.generate", api.CaptureText,
         process=API_SERVER, needs="capture_content", state=API),
    Hook("request.outputs", f"{_OP}.process_outputs", api.wrap_process_outputs,
         process=API_SERVER, state=API),
    Hook("request.finish", f"{_OP}._update_stats_from_finished", api.wrap_finished,
         process=API_SERVER, state=API),
    Hook("request.abort", f"{_OP}.abort_requests", api.wrap_abort_requests, process=API_SERVER,
         state=API),
    Hook("request.error", f"{_OP}.propagate_error", api.wrap_propagate_error,
         process=API_SERVER, state=API),
    Hook("request.vllm_span", f"{_OP}.do_tracing", api.wrap_do_tracing, process=API_SERVER,
         state=API),
    Hook("request.engine_arrival", f"{_SCHED}.add_request",
         engine.wrap_scheduler_add_request, stage=semconv.STAGE_QUEUE,
         process=ENGINE_CORE, state=ENGINE),
    Hook("request.admission_attempt", f"{_SCHED}._get_local_prefix_cache_hit",
         engine.wrap_prefix_lookup, stage=semconv.STAGE_QUEUE, process=ENGINE_CORE, state=ENGINE),
    Hook("request.admission", f"{_SCHED}.schedule", engine.wrap_schedule,
         stage=semconv.STAGE_QUEUE, process=ENGINE_CORE, state=ENGINE),
    Hook("request.preempt", f"{_SCHED}._preempt_request", engine.wrap_preempt_request,
         stage=semconv.STAGE_QUEUE, process=ENGINE_CORE, state=ENGINE),
    Hook("request.engine_output", f"{_SCHED}.update_from_output",
         engine.wrap_update_from_output, process=ENGINE_CORE, state=ENGINE),
    Hook("request.engine_finish", f"{_SCHED}.finish_requests",
         engine.wrap_finish_requests, process=ENGINE_CORE, state=ENGINE),
    Hook("request.adapter_load", "vllm.lora.worker_manager:WorkerLoRAManager._load_adapter",
         worker.wrap_load_adapter, stage=semconv.STAGE_WARMUP_ADAPTER, process=WORKER,
         state=WORKER_PART),
    Hook("request.step_execute", f"{_WORKER}.execute_model", worker.wrap_execute_model,
         stage=semconv.STAGE_PREFILL_WAIT, process=WORKER, state=WORKER_PART),
    Hook("request.step_sample", f"{_WORKER}.sample_tokens", worker.wrap_sample_tokens,
         stage=semconv.STAGE_PREFILL_WAIT, process=WORKER, state=WORKER_PART),
    # async scheduling: the step's output is resolved later, by its ``get_output``
    *(Hook(f"request.step_output_{kind}", f"{target}.get_output", worker.wrap_get_output,
           process=WORKER, optional=True, state=WORKER_PART)
      for kind, target in _ASYNC_OUTPUTS),
    Hook("request.graph_dispatch", "vllm.v1.cudagraph_dispatcher:CudagraphDispatcher.dispatch",
         graphs.wrap_dispatch_v1, stage=semconv.STAGE_PREFILL, process=WORKER,
         state=WORKER_PART),
    Hook("request.graph_dispatch_v2",
         "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch",
         graphs.wrap_dispatch_v2, stage=semconv.STAGE_PREFILL, process=WORKER,
         state=WORKER_PART),
]

_FINISH = next(h for h in HOOKS if h.name == "request.finish")


PARTS: list[PartSpec] = [
    # a failure of ours outside any wrapper (the deferred emission) is the finish hook's
    PartSpec(API, lambda ps: api.ApiRequests(ps, functools.partial(report_failure, _FINISH))),
    PartSpec(ENGINE, lambda ps: engine.EngineRequests(ps.config.cold_requests,
                                                      ps.part(activation.PART))),
    PartSpec(WORKER_PART, lambda ps: worker.WorkerSteps()),
]
