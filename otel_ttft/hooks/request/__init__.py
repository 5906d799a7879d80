"""The request path: one span per request whose stage children tile its server-side TTFT, built
after the fact from timestamps vLLM already records.

Lifecycle of one request, hook by hook (``HOOKS`` below, in this order):

API process (``api``):

- ``request.generate`` -- ``AsyncLLM.generate``: a pass-through generator that remembers the
  caller's parent context (the current HTTP span, else the incoming ``traceparent``, which vLLM
  drops when its own tracing is off), when the first output was handed to the HTTP layer, and
  closes the record however the request ends (finish, abort, disconnect, error) so that no
  request is left unreported. Per later output it only hands the item on (the finish reasons
  are read off the last one), unless output text is captured (opt-in).
- ``request.flush`` -- starlette's ``StreamingResponse.stream_response``: when the chunk carrying
  the first token was written to the client.
- ``request.add`` -- ``OutputProcessor.add_request``: the record, with vLLM's arrival time, prompt
  size, sampling parameters, LoRA adapter and activation (cold/warm) bookkeeping.
- ``request.outputs`` -- ``OutputProcessor.process_outputs`` (hot): the first output's engine
  timestamp, QUEUED/SCHEDULED/PREEMPTED events and the EngineCore payload; the second token's time.
  Per output: two attribute reads and a lookup among the requests still waiting for their first
  two tokens (``state.fresh``); output tokens are counted once, from vLLM's state, at the end.
- ``request.finish`` / ``request.abort`` / ``request.error`` -- ``_finish_request``,
  ``abort_requests``, ``propagate_error``: requests that do not come through ``generate``
  (offline ``LLMEngine``) are closed here.
- ``request.vllm_span`` -- ``OutputProcessor.do_tracing``: when vLLM's own tracing is on, its
  ``llm_request`` is not emitted; its attributes are carried by ours (one span per request).

EngineCore (``engine``; counts, never builds spans): ``request.engine_arrival`` (queue depth and
KV blocks at arrival), ``request.admission_attempt`` (prefix-cache lookups = admission attempts),
``request.admission`` / ``request.preempt`` (schedule times when vLLM records no events),
``request.engine_output`` (ships the ``payload`` with the request's first output),
``request.engine_finish`` (forgets requests that end before any output).

Worker (``worker``): ``request.adapter_load`` (an adapter loaded inside a step; compiles inside a
step are timed by ``warmup.compile``, the one ``monitor_torch_compile`` wrapper) and
``request.warmup_ship`` (hands those times to EngineCore with the step's output).

Modules: ``api`` (API-process hooks), ``engine`` (EngineCore hooks), ``worker`` (adapter/compile/
output hooks), ``payload`` (EngineCore -> API payload), ``state`` (per-request state),
``timeline`` (the tiling rule), ``detail`` (which requests get a span), ``spans`` (the span tree),
``metrics`` (the TTFT histogram and time per stage).
"""

from __future__ import annotations

from otel_ttft import semconv
from otel_ttft.hooks.registry import Hook
from otel_ttft.hooks.request import engine, worker
from otel_ttft.hooks.request.api import (
    Generate,
    wrap_abort_requests,
    wrap_add_request,
    wrap_do_tracing,
    wrap_finish_request,
    wrap_process_outputs,
    wrap_propagate_error,
    wrap_stream_response,
)

API_SERVER, ENGINE_CORE, WORKER = "api_server", "engine_core", "worker"
_OP = "vllm.v1.engine.output_processor:OutputProcessor"
_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
HOOKS: list[Hook] = [
    Hook("request.generate", "vllm.v1.engine.async_llm:AsyncLLM.generate", Generate,
         process=API_SERVER),
    Hook("request.flush", "starlette.responses:StreamingResponse.stream_response",
         wrap_stream_response, stage=semconv.STAGE_FRONTEND, process=API_SERVER,
         optional=True),
    Hook("request.add", f"{_OP}.add_request", wrap_add_request, process=API_SERVER),
    Hook("request.outputs", f"{_OP}.process_outputs", wrap_process_outputs, process=API_SERVER),
    Hook("request.finish", f"{_OP}._finish_request", wrap_finish_request, process=API_SERVER),
    Hook("request.abort", f"{_OP}.abort_requests", wrap_abort_requests, process=API_SERVER),
    Hook("request.error", f"{_OP}.propagate_error", wrap_propagate_error, process=API_SERVER),
    Hook("request.vllm_span", f"{_OP}.do_tracing", wrap_do_tracing, process=API_SERVER),
    Hook("request.engine_arrival", f"{_SCHED}.add_request",
         engine.wrap_scheduler_add_request, stage=semconv.STAGE_QUEUE,
         process=ENGINE_CORE),
    Hook("request.admission_attempt", f"{_SCHED}._get_local_prefix_cache_hit",
         engine.wrap_prefix_lookup, stage=semconv.STAGE_QUEUE, process=ENGINE_CORE),
    Hook("request.admission", f"{_SCHED}.schedule", engine.wrap_schedule,
         stage=semconv.STAGE_QUEUE, process=ENGINE_CORE),
    Hook("request.preempt", f"{_SCHED}._preempt_request", engine.wrap_preempt_request,
         stage=semconv.STAGE_QUEUE, process=ENGINE_CORE),
    Hook("request.engine_output", f"{_SCHED}.update_from_output",
         engine.wrap_update_from_output, process=ENGINE_CORE),
    Hook("request.engine_finish", f"{_SCHED}.finish_requests",
         engine.wrap_finish_requests, process=ENGINE_CORE),
    Hook("request.adapter_load", "vllm.lora.worker_manager:WorkerLoRAManager._load_adapter",
         worker.wrap_load_adapter, stage=semconv.STAGE_WARMUP_ADAPTER, process=WORKER),
    Hook("request.warmup_ship", "vllm.v1.executor.multiproc_executor:WorkerProc.enqueue_output",
         worker.wrap_enqueue_output, stage=semconv.STAGE_WARMUP_ADAPTER, process=WORKER),
]

