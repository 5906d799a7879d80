"""The request path: one span per request whose stage children tile its server-side TTFT, built
after the fact from timestamps vLLM already records.

Lifecycle of one request, hook by hook (``HOOKS`` below, in this order):

API process (``api``, ``caller``):

- ``request.flush`` -- starlette's ``StreamingResponse.stream_response``: when the chunk carrying
  the first token was written to the client.
- ``request.caller_server`` -- ``extract_trace_headers`` in vLLM's server (``BaseServing``),
  called only for a request that carries trace headers: counts it on its way to the engine.
- ``request.caller`` -- ``AsyncLLM.add_request``: the caller's ``trace_headers``
  (``traceparent``), which vLLM drops unless its own tracing is on. In vLLM's server, vLLM's
  own method runs instead while no traced request is on its way (``registry.bypass``).
- ``request.add`` -- ``OutputProcessor.add_request``: the record, with vLLM's arrival time, prompt
  size, sampling parameters, LoRA adapter and activation (cold/warm) bookkeeping. ``generate``
  calls it in the HTTP response's task, so the current context is the caller's (the server span,
  if any; else the caller's ``traceparent``) and the response that
  streams it is known.
- ``request.generate`` -- ``AsyncLLM.generate``, applied only with content capture opted in (the
  output text per choice); otherwise vLLM's ``generate`` is not wrapped at all.
- ``request.outputs`` -- the first output's engine timestamp, QUEUED/SCHEDULED/PREEMPTED events
  and the EngineCore payload; the second token's time. Seen on the request's own
  ``LogprobsProcessor.update_from_output`` (``api.FirstOutputs``, an instance attribute set by
  ``request.add`` and removed at its second token or its end): no frame of ours a step, only
  for that request's first outputs. Where that is not possible (vLLM's stats logging off, a
  pooling request, no ``request.finish``), ``OutputProcessor.process_outputs`` (hot) looks at
  every output of a step while such a request waits (``state.fresh``); while none waits, vLLM's
  own method runs without our wrapper (``registry.bypass``).
- ``request.finish`` -- ``OutputProcessor._update_stats_from_finished``: a request ended (its
  final output, or a stop string its detokenizer found); output tokens and preemptions are read
  once, from vLLM's state.
- ``request.abort`` / ``request.error`` -- ``abort_requests``, ``propagate_error``: requests that
  end otherwise. An offline (``LLMEngine``)
  request is emitted when it finishes; one a ``generate`` call consumes once that call took its
  final output from the queue (looked at on the event loop right after), or, if the caller left
  first (vLLM aborts on the way out), as aborted: no request is left unreported.
- ``request.vllm_span`` -- ``OutputProcessor.do_tracing``: when vLLM's own tracing is on, its
  ``llm_request`` is not emitted; its attributes are carried by ours (one span per request).
- ``request.first_use.*`` -- what the front end's ``lru_cache`` functions run on a miss
  (logits-processor plugin discovery, chat template compile): a fill inside a request's front
  end is its ``warmup.first_use`` (``first_use``).

EngineCore (``engine``; counts, never builds spans): ``request.engine_arrival`` (queue depth and
KV blocks at arrival), ``request.admission_attempt`` (prefix-cache lookups = admission attempts),
``request.admission`` / ``request.preempt`` (schedule times when vLLM records no events),
``request.engine_output`` (ships the ``payload`` with the request's first output),
``request.engine_finish`` (forgets requests that end before any output).

Worker (``worker``): ``request.adapter_load`` (an adapter loaded inside a step; compiles inside a
step are timed by ``warmup.compile``, the one ``monitor_torch_compile`` wrapper) and
``request.warmup_ship`` (hands those times to EngineCore with the step's output).

Modules: ``api`` (API-process hooks: the record, its outputs, its end), ``caller`` (the caller's
trace headers), ``settle`` (a request's end and the batched emission), ``ends`` (abort, engine
failure, vLLM's own span), ``flush`` (the first token's chunk on its way out), ``first_use``
(front-end cache fills), ``engine`` (EngineCore hooks), ``worker`` (adapter/compile/output hooks),
``payload`` (EngineCore -> API payload), ``state`` (per-request state), ``timeline`` (the tiling
rule), ``detail`` (which requests get a span), ``spans`` (the span tree), ``remote`` (a request
span built in the API server's export process), ``attributes`` (the request span's attributes),
``metrics`` (the TTFT histogram and time per stage), ``histogram`` (TTFT samples written into the
SDK's own aggregation).
"""

from __future__ import annotations

from otel_ttft import semconv
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.hooks.request import engine, first_use, worker
from otel_ttft.runtime.hooks.request.api import (
    FINISH_HOOK,
    OUTPUTS_HOOK,
    CaptureText,
    wrap_add_request,
)
from otel_ttft.runtime.hooks.request.caller import SERVER_HEADERS_HOOK, wrap_engine_add_request
from otel_ttft.runtime.hooks.request.ends import (
    wrap_abort_requests,
    wrap_do_tracing,
    wrap_propagate_error,
)
from otel_ttft.runtime.hooks.request.flush import wrap_stream_response

API_SERVER, ENGINE_CORE, WORKER = semconv.PROCESS_KINDS
_OP = "vllm.v1.engine.output_processor:OutputProcessor"
_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
HOOKS: list[Hook] = [
    Hook("request.flush", "starlette.responses:StreamingResponse.stream_response",
         wrap_stream_response, stage=semconv.STAGE_FRONTEND, process=API_SERVER,
         optional=True),
    SERVER_HEADERS_HOOK,
    Hook("request.caller", "vllm.v1.engine.async_llm:AsyncLLM.add_request",
         wrap_engine_add_request, process=API_SERVER),
    Hook("request.add", f"{_OP}.add_request", wrap_add_request, process=API_SERVER),
    Hook("request.generate", "vllm.v1.engine.async_llm:AsyncLLM.generate", CaptureText,
         process=API_SERVER, needs="capture_content"),
    OUTPUTS_HOOK,
    FINISH_HOOK,
    Hook("request.abort", f"{_OP}.abort_requests", wrap_abort_requests, process=API_SERVER),
    Hook("request.error", f"{_OP}.propagate_error", wrap_propagate_error, process=API_SERVER),
    Hook("request.vllm_span", f"{_OP}.do_tracing", wrap_do_tracing, process=API_SERVER),
    *first_use.HOOKS,
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

