"""The request path: the ``llm_request`` span and its stage children, GenAI semantic-convention
names, the request-detail policy, and the server TTFT and stage metrics."""

from otel_ttft.semconv.stages import STAGE_FIRST_DECODE, STAGE_FRONTEND, STAGE_PREFILL, STAGE_QUEUE

#: one span per request in the API process, named like vLLM's own: when vLLM's tracing is on, its
#: llm_request is suppressed and ours carries its attributes
SPAN_REQUEST = "llm_request"
SPAN_REQUEST_INPUT = "Frontend input"  # frontend: arrival -> engine queue (render, tokenize, IPC)
SPAN_REQUEST_QUEUE = "Queue"  # queued -> scheduled; a preemption before the first token requeues
SPAN_REQUEST_PREFILL = "Prefill"  # scheduled -> first token computed (all chunks)
SPAN_REQUEST_OUTPUT = "Frontend output"  # first token computed -> handed to the HTTP layer
SPAN_REQUEST_FIRST_DECODE = "First decode"  # first -> second token; outside TTFT
EVENT_REQUEST_PREEMPTED = "preempted"  # on llm_request: one per preemption of the request
ATTR_EVENT_BEFORE_FIRST_TOKEN = "ttft.request.before_first_token"  # on EVENT_REQUEST_PREEMPTED

# GenAI semantic conventions
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"  # GenAI: the model (or adapter) that answered
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"  # GenAI: stop, length, abort, ...
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"  # GenAI: prompt tokens
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"  # GenAI: tokens generated
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # prefix-cache hits
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"  # GenAI sampling parameter
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"  # GenAI sampling parameter
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"  # GenAI sampling parameter
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"  # GenAI: the request's output token limit
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"  # GenAI sampling parameter
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"  # GenAI sampling parameter
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"  # GenAI sampling parameter
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"  # GenAI: choices asked for (n)
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # prompt text: opt-in only (capture content)
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # output text: opt-in only

# vLLM's own llm_request attributes, carried over when its tracing is on
VLLM_REQUEST_ID = "gen_ai.request.id"  # vLLM's request id
VLLM_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"  # vLLM's own TTFT, s
ATTR_REQUEST_TTFT = "ttft.request.time_to_first_token"  # s: arrival -> first token handed over
#: a streamed response (TTFT ends at the first chunk handed to HTTP)
ATTR_REQUEST_STREAMING = "ttft.request.streaming"
#: the client left before the final output reached it, or the request was aborted
ATTR_REQUEST_ABORTED = "ttft.request.aborted"
#: preemptions of the request (each a preempted event)
ATTR_REQUEST_PREEMPTIONS = "ttft.request.preemptions"
ATTR_REQUEST_SCHEDULE_KNOWN = "ttft.request.schedule_known"  # False: queue/prefill not split
ATTR_REQUEST_ADMISSION_FAILED = "ttft.request.admission.failed_attempts"  # no KV blocks
ATTR_REQUEST_ARRIVAL_WAITING = "ttft.request.arrival.waiting_requests"  # engine queue depth
#: requests running in the engine at arrival
ATTR_REQUEST_ARRIVAL_RUNNING = "ttft.request.arrival.running_requests"
ATTR_REQUEST_ARRIVAL_KV_FREE = "ttft.request.arrival.kv_free_blocks"  # free KV blocks at arrival
#: KV blocks in all at arrival
ATTR_REQUEST_ARRIVAL_KV_TOTAL = "ttft.request.arrival.kv_total_blocks"
ATTR_REQUEST_ARRIVAL_KV_USAGE = "ttft.request.arrival.kv_usage"  # 0..1 of the KV cache at arrival
#: among the first OTEL_TTFT_COLD_REQUESTS after an activation, or it waited for warm-up work
#: (an adapter load, a compile)
ATTR_REQUEST_COLD = "ttft.request.cold"
ATTR_REQUEST_ACTIVATION_INDEX = "ttft.request.activation.index"  # 1 = first after activation
ATTR_REQUEST_SINCE_READY = "ttft.request.activation.since_ready"  # s; < 0: arrived before ready
ATTR_FRONTEND_PHASE = "ttft.frontend.phase"  # on Frontend input / output: input | output
ATTR_LORA_NAME = "ttft.lora.name"  # the request's LoRA adapter
ATTR_LORA_ID = "ttft.lora.id"  # the adapter's integer id in vLLM
ATTR_LORA_LOAD_SECONDS = "ttft.lora.load.seconds"  # set when this request triggered the load
ATTR_REQUEST_COMPILE_SECONDS = "ttft.request.compile.seconds"  # torch.compile inside this TTFT
#: on a request's torch.compile (warmup.step_compile): what Dynamo compiled, ``file:function``
ATTR_COMPILE_FRAME = "ttft.compile.frame"
ATTR_COMPILE_ID = "ttft.compile.id"  # on a request's torch.compile: Dynamo's id, ``frame/attempt``
#: on a request's torch.compile: True when Dynamo had compiled that frame before (a guard failed:
#: a shape, dtype or value it had not seen)
ATTR_COMPILE_RECOMPILE = "ttft.compile.recompile"
#: on a request's torch.compile: vLLM's own model graph compiled (its compilation counter moved),
#: not a helper outside the model
ATTR_COMPILE_MODEL_GRAPH = "ttft.compile.model_graph"
#: on the request (GPU, CUDA graphs captured): vLLM's CUDA-graph mode for the first step of its
#: prefill (``NONE``: it ran eager, no captured graph fitted the step)
ATTR_STEP_CUDAGRAPH_MODE = "ttft.step.cudagraph.mode"
ATTR_STEP_CUDAGRAPH_TOKENS = "ttft.step.cudagraph.tokens"  # on the request: tokens in that step
#: on the request: the largest batch, in tokens, a graph captured for mixed (prefill) batches
#: takes: piecewise when that mode runs prefills, full in full-only mode; 0: no graph can run one
ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS = "ttft.cudagraph.max_captured_tokens"
#: on the request: the largest full graph captured, in tokens (decode-only ones included)
ATTR_CUDAGRAPH_MAX_FULL_TOKENS = "ttft.cudagraph.max_full_tokens"
#: on the request: the largest batch captured piecewise, in tokens (0: no piecewise graphs)
ATTR_CUDAGRAPH_MAX_PIECEWISE_TOKENS = "ttft.cudagraph.max_piecewise_tokens"
#: on the request: tokens the first prefill step ran as, padded to the graph's size
ATTR_STEP_CUDAGRAPH_PADDED_TOKENS = "ttft.step.cudagraph.padded_tokens"
#: on the request: how that step ran: ``full_graph``, ``piecewise_graph``, ``compiled`` (no graph,
#: the torch.compiled model) or ``eager`` (no graph, no compile)
ATTR_STEP_EXECUTION = "ttft.step.execution"
#: ttft.step.execution values: the step replayed a full graph, or the piecewise ones
EXECUTION_FULL_GRAPH, EXECUTION_PIECEWISE_GRAPH = "full_graph", "piecewise_graph"
#: ttft.step.execution values: outside every graph, the compiled model, or the eager one
EXECUTION_COMPILED, EXECUTION_EAGER = "compiled", "eager"
#: on the request: where the decision was read: ``cudagraph_stats`` (vLLM's per-step record,
#: ``--cudagraph-metrics``, after data-parallel ranks agreed) or ``dispatch`` (the dispatcher's
#: answer for the step's tokens)
ATTR_STEP_CUDAGRAPH_SOURCE = "ttft.step.cudagraph.source"
#: on a request's torch.compile span: which compiler ran inside the step: ``dynamo`` (torch.compile)
#: or ``triton`` (a ``@triton.jit`` kernel compiled on first use)
ATTR_COMPILE_COMPILER = "ttft.compile.compiler"
ATTR_STEP_TOKENS = "ttft.step.tokens"  # on a request's torch.compile: tokens in the step it ran in
ATTR_STEP_REQUESTS = "ttft.step.requests"  # on a request's torch.compile: requests in that step
# A cache of the front end filled inside this request (warmup.first_use): one child span per fill
#: one child span per front-end cache filled inside a cold request (warmup.first_use)
SPAN_FIRST_USE = "Front-end first use"
ATTR_FIRST_USE_CACHE = "ttft.first_use.cache"  # which cache: logits-processor plugins, ...
#: one child span of Prefill per step that ran this request's prefill while its worker waited for
#: a CPU (prefill.wait); its length is the step's wall time minus the worker thread's CPU time
#: (where within the step the waiting fell is not measured: the span ends with the step)
SPAN_PREFILL_WAIT = "Prefill wait"
#: s, on Prefill wait and the request: wall time of the worker's steps that ran this prefill
ATTR_STEP_WALL_SECONDS = "ttft.step.wall.seconds"
#: s, on Prefill wait and the request: CPU time the worker thread got within those steps
ATTR_STEP_CPU_SECONDS = "ttft.step.cpu.seconds"
#: 0..1, on Prefill wait and the request: CPU seconds over wall seconds of those steps
ATTR_STEP_CPU_RATIO = "ttft.step.cpu_ratio"
#: s, on Prefill wait and the request: time EngineCore's thread was runnable and had no CPU (the
#: kernel's run-queue delay) within the engine steps that ran this prefill
ATTR_ENGINE_QUEUED_SECONDS = "ttft.engine.queued.seconds"
#: s, on Prefill wait and the request: time a CPU worker's thread was runnable and had no CPU
#: within the steps that ran this prefill and in the gap before each (waking up for the step: a
#: second vLLM server spinning on the same core holds it there)
ATTR_STEP_QUEUED_SECONDS = "ttft.step.queued.seconds"
#: one child span of Prefill on a request after an activation whose prompt began with a prefix
#: the warm requests before the activation had found in vLLM's prefix cache, and that this request
#: computed (prefill.uncached_prefix): the prefill of those tokens, at the start of the prefill
#: (prefill time taken as linear in the tokens computed)
SPAN_PREFILL_UNCACHED_PREFIX = "Prefill of uncached prefix"
#: on the request (and its Prefill of uncached prefix span): prompt tokens whose prefix the warm
#: requests before the activation had found in vLLM's prefix cache, and this request computed
ATTR_REQUEST_UNCACHED_PREFIX_TOKENS = "ttft.request.uncached_prefix.tokens"
#: s, on the request: the prefill of those tokens (prefill.uncached_prefix)
ATTR_REQUEST_UNCACHED_PREFIX_SECONDS = "ttft.request.uncached_prefix.seconds"
#: s, on Prefill wait: EngineCore handed the step over -> its worker began it, plus the worker's
#: output left -> EngineCore had it, beyond what the step's own readings explain (both sides
#: stamp the host-wide monotonic clock): a worker not runnable at all (stopped, frozen, paged in)
ATTR_STEP_HANDOFF_SECONDS = "ttft.step.handoff.seconds"
#: on Prefill wait: the worker's major page faults since its previous step (/proc/self/stat)
ATTR_STEP_MAJOR_FAULTS = "ttft.step.major_faults"
#: s, on Prefill wait: the host's steal time since the worker's previous step (/proc/stat: its
#: vCPUs taken by the hypervisor)
ATTR_HOST_STEAL_SECONDS = "ttft.host.steal.seconds"
#: s, on Prefill wait: time the worker's cgroup was throttled by its CPU quota since its previous
#: step (cgroup cpu.stat)
ATTR_CGROUP_THROTTLED_SECONDS = "ttft.cgroup.throttled.seconds"
#: on Prefill wait: what the evidence says it was (WAIT_CAUSES)
ATTR_WAIT_CAUSE = "ttft.wait.cause"
WAIT_CAUSE_RUN_QUEUE = "run_queue"  # ttft.wait.cause: runnable, no CPU (another process on it)
WAIT_CAUSE_STEAL = "steal"  # ttft.wait.cause: the hypervisor took the host's vCPUs
WAIT_CAUSE_THROTTLED = "cgroup_throttled"  # ttft.wait.cause: the cgroup's CPU quota ran out
WAIT_CAUSE_MAJOR_FAULTS = "major_faults"  # ttft.wait.cause: memory paged back in (swap, files)
#: ttft.wait.cause: the worker was not runnable and nothing readable says why (stopped, its
#: cgroup frozen, blocked in the kernel)
WAIT_CAUSE_NOT_RUNNABLE = "not_runnable"
#: the values of ttft.wait.cause
WAIT_CAUSES = (WAIT_CAUSE_RUN_QUEUE, WAIT_CAUSE_STEAL, WAIT_CAUSE_THROTTLED,
               WAIT_CAUSE_MAJOR_FAULTS, WAIT_CAUSE_NOT_RUNNABLE)
#: s, on the request: time its prefill steps waited for a CPU (named as prefill.wait)
ATTR_REQUEST_WAIT_SECONDS = "ttft.request.wait.seconds"
ATTR_REQUEST_FIRST_USE_SECONDS = "ttft.request.first_use.seconds"  # s of fills inside this TTFT
ATTR_LINK_KIND = "ttft.link.kind"  # on span links: what the link points at
#: ttft.link.kind of the link to the activation a request may have paid for
LINK_KIND_ACTIVATION = "activation"
#: histogram, s (TTFT_BUCKETS_S), by gen_ai.request.model, ttft.request.cold,
#: gen_ai.operation.name and gen_ai.provider.name: server-side TTFT (the GenAI semconv name), one
#: sample per request; a request with a span leads to it (exemplar)
METRIC_SERVER_TTFT = "gen_ai.server.time_to_first_token"

#: counter, s, by ttft.stage and the TTFT histogram's attributes: seconds requests spent in each
#: stage (frontend, queue, prefill, first_decode), summed in-process and read at export (no SDK
#: call per request); a stage's share of TTFT is its rate over the TTFT sum's
METRIC_REQUEST_STAGE_TIME = "ttft.request.stage.time"
#: gauge, by gen_ai.request.model: engine queue depth at the latest arrival
METRIC_REQUEST_ARRIVAL_WAITING = "ttft.request.arrival.waiting_requests"
#: gauge, 0..1, by gen_ai.request.model: KV-cache usage at the latest arrival
METRIC_REQUEST_ARRIVAL_KV_USAGE = "ttft.request.arrival.kv_usage"
#: buckets of the TTFT histograms: the GenAI advisory boundaries, then on to 20 minutes
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 30,
    60, 120, 300, 600, 1200,
)

#: EngineCore -> API: our per-request counts ride on the first EngineCoreOutput's trace_headers
#: under this key
ENGINE_PAYLOAD_HEADER = "x-otel-ttft"
#: GenAI: chat, or text_completion for /v1/completions and offline generate
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_OPERATION_CHAT = "chat"  # gen_ai.operation.name of chat completions

# GenAI conventions on request spans and on the TTFT and stage metrics
#: gen_ai.operation.name of completions and offline generate
GEN_AI_OPERATION_TEXT_COMPLETION = "text_completion"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"  # GenAI: the serving system
GEN_AI_PROVIDER_VLLM = "vllm"  # gen_ai.provider.name of every request

#: the engine rejected the request on arrival (vLLM >= 0.33 EngineCoreOutput.error): nothing ran
ATTR_REQUEST_REJECTED = "ttft.request.rejected"

# An llm_request span carries its TTFT stages as durations (s). By default only the requests that
# need explaining (cold, slow, the model's tail, errors, a sampled share) get a span (with its stage
# children), and those the caller traces; every request is counted in the metrics.
ATTR_REQUEST_STAGE_FRONTEND_SECONDS = "ttft.request.stage.frontend.seconds"  # s: input + output
ATTR_REQUEST_STAGE_QUEUE_SECONDS = "ttft.request.stage.queue.seconds"  # s in queue
ATTR_REQUEST_STAGE_PREFILL_SECONDS = "ttft.request.stage.prefill.seconds"  # s in prefill
ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS = "ttft.request.stage.first_decode.seconds"  # s, not TTFT
#: request stage -> the llm_request attribute carrying its duration
REQUEST_STAGE_SECONDS = {
    STAGE_FRONTEND: ATTR_REQUEST_STAGE_FRONTEND_SECONDS,
    STAGE_QUEUE: ATTR_REQUEST_STAGE_QUEUE_SECONDS,
    STAGE_PREFILL: ATTR_REQUEST_STAGE_PREFILL_SECONDS,
    STAGE_FIRST_DECODE: ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS,
}
ATTR_REQUEST_DETAIL = "ttft.request.detail"  # why the children were built; absent: they were not

#: values of ttft.request.detail (why a request's stage children were built)
DETAIL_ALL, DETAIL_COLD, DETAIL_SLOW, DETAIL_TAIL, DETAIL_ERROR, DETAIL_SAMPLED = (
    "all", "cold", "slow", "tail", "error", "sampled")

DETAIL_AUTO, DETAIL_SPANS, DETAIL_NONE = "auto", "spans", "none"  # OTEL_TTFT_REQUEST_DETAIL too
REQUEST_DETAIL_TAIL_QUANTILE = 0.99  # tail: above this quantile of its model's last 256
