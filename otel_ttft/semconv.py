"""Every span name, attribute key, metric name and stage value otel-ttft emits.

One place, so that hooks, metrics, analysis and dashboards cannot drift apart. To find where a
stage is measured, grep for its constant name (e.g. ``STAGE_LOAD_READ``) under ``otel_ttft/hooks``.
GenAI semantic-convention names are used where they exist.
"""

from __future__ import annotations

# --- stages (DESIGN.md vocabulary; dotted values are sub-stages of their family) -------------
STAGE_SWITCH = "switch"
STAGE_SWITCH_SLEEP = "switch.sleep"

STAGE_LOAD = "load"
STAGE_LOAD_INIT = "load.init"  # model construction: parameter allocation before weights arrive
STAGE_LOAD_READ = "load.read"  # checkpoint shard reads
STAGE_LOAD_PROCESS = "load.process"  # dequantization / post-processing after loading
STAGE_LOAD_H2D = "load.h2d"  # host-to-device copies (GPU path; wake-up)

STAGE_WARMUP = "warmup"
STAGE_WARMUP_PROCESS_START = "warmup.process_start"  # exec -> first vLLM span: imports
STAGE_WARMUP_FRONTEND = "warmup.frontend"  # API server: arg checks, socket, app, tokenizer
STAGE_WARMUP_DEVICE_INIT = "warmup.device_init"
STAGE_WARMUP_PROFILE = "warmup.profile"
STAGE_WARMUP_COMPILE = "warmup.compile"
STAGE_WARMUP_GRAPH_CAPTURE = "warmup.graph_capture"
STAGE_WARMUP_KV_ALLOC = "warmup.kv_alloc"
STAGE_WARMUP_ADAPTER = "warmup.adapter"  # LoRA adapter load

STAGE_QUEUE = "queue"
STAGE_PREFILL = "prefill"
STAGE_FRONTEND = "frontend"
STAGE_NETWORK = "network"
STAGE_FIRST_DECODE = "first_decode"

STAGE_FAMILIES = (
    STAGE_SWITCH, STAGE_LOAD, STAGE_WARMUP, STAGE_QUEUE, STAGE_PREFILL,
    STAGE_FRONTEND, STAGE_NETWORK, STAGE_FIRST_DECODE,
)
# The stages a client TTFT is split into, in pipeline order (the order a verdict walks them).
TTFT_PIPELINE = (
    STAGE_SWITCH, STAGE_LOAD, STAGE_WARMUP, STAGE_FRONTEND, STAGE_QUEUE, STAGE_PREFILL,
    STAGE_NETWORK,
)
ALL_STAGES = (
    STAGE_SWITCH, STAGE_SWITCH_SLEEP,
    STAGE_LOAD, STAGE_LOAD_INIT, STAGE_LOAD_READ, STAGE_LOAD_PROCESS, STAGE_LOAD_H2D,
    STAGE_WARMUP, STAGE_WARMUP_PROCESS_START, STAGE_WARMUP_FRONTEND, STAGE_WARMUP_DEVICE_INIT,
    STAGE_WARMUP_PROFILE, STAGE_WARMUP_COMPILE, STAGE_WARMUP_GRAPH_CAPTURE, STAGE_WARMUP_KV_ALLOC,
    STAGE_WARMUP_ADAPTER,
    STAGE_QUEUE, STAGE_PREFILL, STAGE_FRONTEND, STAGE_NETWORK, STAGE_FIRST_DECODE,
)


def stage_family(stage: str) -> str:
    """``warmup.compile`` -> ``warmup``."""
    return stage.split(".", 1)[0]


# --- span names we open (vLLM's own names are in VLLM_SPAN_STAGES) ------------------------------
SPAN_ACTIVATION = "vllm.activation"
SPAN_PROCESS_START = "process start and imports"
SPAN_FRONTEND_SETUP = "API server ready"
SPAN_ENGINE_CONFIG = "Create engine config"
SPAN_ENGINE_CLIENT = "Engine client init"
SPAN_SHARD_READ = "Read checkpoint shard"
SPAN_PROCESS_WEIGHTS = "Process weights after loading"
SPAN_DEVICE_INIT = "Init device"  # same name vLLM uses on GPU; opened by us where vLLM has none
SPAN_PROFILE_RUN = "Profile run"
SPAN_TORCH_COMPILE = "torch.compile"
SPAN_KV_ALLOC = "Allocate KV cache"  # vLLM's name; we enrich it
SPAN_SLEEP = "Sleep"
SPAN_WAKE_UP = "Wake up"
SPAN_ADAPTER_LOAD = "Load LoRA adapter"

# vLLM 0.32's own @instrument spans -> the stage they measure; tagged on start, never re-opened.
VLLM_SPAN_STAGES: dict[str, str] = {
    "API server setup": STAGE_WARMUP_FRONTEND,
    "Overall Loading": STAGE_WARMUP,
    "AsyncMPClient init": STAGE_WARMUP,
    "SyncMPClient init": STAGE_WARMUP,
    "EngineCoreProc init": STAGE_WARMUP,
    "Executor init": STAGE_WARMUP,
    "Worker init": STAGE_WARMUP,
    "Init device": STAGE_WARMUP_DEVICE_INIT,
    "Loading (CPU)": STAGE_LOAD,
    "Loading (GPU)": STAGE_LOAD,
    "Load model": STAGE_LOAD,
    "Download weights - HF": STAGE_LOAD_READ,
    "Initialize model": STAGE_LOAD_INIT,
    "Load weights": STAGE_LOAD,
    "Prepare model": STAGE_WARMUP,
    "Warmup (CPU)": STAGE_WARMUP,  # inside our "Profile run" on CPU; compile nests inside it
    "Warmup (GPU)": STAGE_WARMUP,
    "Allocate KV cache": STAGE_WARMUP_KV_ALLOC,
    "Capture model": STAGE_WARMUP_GRAPH_CAPTURE,
    "Dynamo bytecode transform": STAGE_WARMUP_COMPILE,
    "Compile graph": STAGE_WARMUP_COMPILE,
    "Inductor compilation": STAGE_WARMUP_COMPILE,
    "DeepGemm warmup": STAGE_WARMUP_COMPILE,
    "CuTeDSL warmup": STAGE_WARMUP_COMPILE,
}

# --- attribute keys -----------------------------------------------------------------------------
ATTR_STAGE = "ttft.stage"
ATTR_PROCESS_KIND = "ttft.process.kind"  # api_server | engine_core | worker
ATTR_ACTIVATION_KIND = "ttft.activation.kind"  # start | wake | adapter
ATTR_ACTIVATION_READY = "ttft.activation.ready"  # bool: the server reached ready
ATTR_HOOK_ERROR = "ttft.hook.error"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
PROCESS_PID = "process.pid"

# checkpoint reads
ATTR_LOAD_FORMAT = "ttft.load.format"
ATTR_SHARD_PATH = "ttft.load.shard.path"
ATTR_SHARD_INDEX = "ttft.load.shard.index"
ATTR_SHARD_BYTES = "ttft.load.shard.bytes"
ATTR_SHARD_TENSORS = "ttft.load.shard.tensors"
ATTR_READ_SECONDS = "ttft.load.read.seconds"  # time inside the reader, not the consumer
ATTR_READ_GB_PER_S = "ttft.load.read.gb_per_s"
ATTR_FS_TYPE = "ttft.load.fs.type"
ATTR_PAGE_CACHE_RESIDENT = "ttft.load.page_cache.resident_ratio"  # 0..1, before the read
ATTR_LOAD_SHARDS = "ttft.load.shards"
ATTR_LOAD_BYTES = "ttft.load.bytes"
ATTR_LOAD_GB_PER_S = "ttft.load.gb_per_s"
ATTR_LOAD_MODEL_BYTES = "ttft.load.model.bytes"  # parameter bytes on the device after loading
ATTR_H2D_BYTES = "ttft.h2d.bytes"
ATTR_H2D_GB_PER_S = "ttft.h2d.gb_per_s"

# device and warm-up
ATTR_DEVICE_TYPE = "ttft.device.type"
ATTR_DEVICE_NAME = "ttft.device.name"
ATTR_COMPILE_MODE = "ttft.compile.mode"
ATTR_COMPILE_CACHE_HIT = "ttft.compile.cache_hit"
ATTR_COMPILE_CACHE_DIR = "ttft.compile.cache_dir"
ATTR_COMPILE_GRAPHS = "ttft.compile.graphs"  # backend compilations during this span
ATTR_COMPILE_RANGES = "ttft.compile.ranges"
ATTR_COMPILE_AOT_LOAD_ATTEMPT = "ttft.compile.aot_load_attempt"  # True: loading a cached artifact
ATTR_PROFILE_AVAILABLE_KV_BYTES = "ttft.profile.available_kv_bytes"
ATTR_GRAPH_COUNT = "ttft.graph.count"
ATTR_GRAPH_BATCH_SIZES = "ttft.graph.batch_sizes"
ATTR_GRAPH_MEMORY_BYTES = "ttft.graph.memory_bytes"
ATTR_KV_BLOCKS = "ttft.kv.blocks"
ATTR_KV_BLOCK_SIZE = "ttft.kv.block_size"
ATTR_KV_BYTES = "ttft.kv.bytes"
ATTR_KV_TOKEN_CAPACITY = "ttft.kv.token_capacity"
ATTR_SLEEP_LEVEL = "ttft.sleep.level"
ATTR_WAKE_TAGS = "ttft.wake.tags"

# --- metrics ------------------------------------------------------------------------------------
METRIC_ACTIVATION_STAGE_DURATION = "ttft.activation.stage.duration"  # histogram, s
METRIC_LOAD_READ_BYTES = "ttft.load.read.bytes"  # counter, By
METRIC_LOAD_READ_THROUGHPUT = "ttft.load.read.throughput"  # histogram, GB/s

# Explicit buckets far above 10 s: cold starts of large models take minutes.
ACTIVATION_DURATION_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200,
    1800, 3600,
)
THROUGHPUT_BUCKETS_GB_PER_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)

# --- environment ---------------------------------------------------------------------------------

# --- request path ---
# One span per request in the API process, named like vLLM's own: when vLLM's tracing is on, its
# `llm_request` is suppressed and its attributes are carried by ours, so there is still one.
SPAN_REQUEST = "llm_request"
SPAN_REQUEST_INPUT = "Frontend input"  # frontend: arrival -> engine queue (render, tokenize, IPC)
SPAN_REQUEST_QUEUE = "Queue"  # queued -> scheduled; a preemption before the first token requeues
SPAN_REQUEST_PREFILL = "Prefill"  # scheduled -> first token computed (all chunks)
SPAN_REQUEST_OUTPUT = "Frontend output"  # first token computed -> handed to the HTTP layer
SPAN_REQUEST_FIRST_DECODE = "First decode"  # first -> second token; outside TTFT
EVENT_REQUEST_PREEMPTED = "preempted"
ATTR_EVENT_BEFORE_FIRST_TOKEN = "ttft.request.before_first_token"  # on EVENT_REQUEST_PREEMPTED

# GenAI semantic conventions
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # prefix-cache hits
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # opt-in only (capture content)
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # opt-in only
# vLLM's own llm_request attributes, carried over when its tracing is on
VLLM_REQUEST_ID = "gen_ai.request.id"
VLLM_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"

ATTR_REQUEST_TTFT = "ttft.request.time_to_first_token"  # s: arrival -> first token handed over
ATTR_REQUEST_STREAMING = "ttft.request.streaming"
ATTR_REQUEST_ABORTED = "ttft.request.aborted"
ATTR_REQUEST_PREEMPTIONS = "ttft.request.preemptions"
ATTR_REQUEST_SCHEDULE_KNOWN = "ttft.request.schedule_known"  # False: queue/prefill not split
ATTR_REQUEST_ADMISSION_FAILED = "ttft.request.admission.failed_attempts"  # no KV blocks
ATTR_REQUEST_ARRIVAL_WAITING = "ttft.request.arrival.waiting_requests"  # engine queue depth
ATTR_REQUEST_ARRIVAL_RUNNING = "ttft.request.arrival.running_requests"
ATTR_REQUEST_ARRIVAL_KV_FREE = "ttft.request.arrival.kv_free_blocks"
ATTR_REQUEST_ARRIVAL_KV_TOTAL = "ttft.request.arrival.kv_total_blocks"
ATTR_REQUEST_ARRIVAL_KV_USAGE = "ttft.request.arrival.kv_usage"  # 0..1
ATTR_REQUEST_COLD = "ttft.request.cold"  # among the first N requests after an activation
ATTR_REQUEST_ACTIVATION_INDEX = "ttft.request.activation.index"  # 1 = first after activation
ATTR_REQUEST_SINCE_READY = "ttft.request.activation.since_ready"  # s; < 0: arrived before ready
ATTR_FRONTEND_PHASE = "ttft.frontend.phase"  # input | output
ATTR_LORA_NAME = "ttft.lora.name"
ATTR_LORA_ID = "ttft.lora.id"
ATTR_LORA_LOAD_SECONDS = "ttft.lora.load.seconds"  # set when this request triggered the load
ATTR_REQUEST_COMPILE_SECONDS = "ttft.request.compile.seconds"  # torch.compile inside this TTFT
ATTR_LINK_KIND = "ttft.link.kind"
LINK_KIND_ACTIVATION = "activation"

METRIC_SERVER_TTFT = "gen_ai.server.time_to_first_token"  # histogram, s
# counter, s; ttft.stage label: seconds requests spent in each stage (summed in-process, read at
# export: no SDK call per request). Mean per request: its rate over the TTFT histogram's count.
METRIC_REQUEST_STAGE_TIME = "ttft.request.stage.time"
METRIC_REQUEST_ARRIVAL_WAITING = "ttft.request.arrival.waiting_requests"  # gauge, latest arrival
METRIC_REQUEST_ARRIVAL_KV_USAGE = "ttft.request.arrival.kv_usage"  # gauge, ratio, latest arrival
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 30,
    60, 120, 300, 600, 1200,
)

# EngineCore -> API: our per-request counts ride on the first EngineCoreOutput's trace_headers
ENGINE_PAYLOAD_HEADER = "x-otel-ttft"

# --- issue 6: switch/replay ---
# Eviction: the outgoing API server, from its stop signal (or a sleep request) until its engine
# processes are gone (or asleep). Its own trace; analyze joins it to a request by time.
SPAN_SWITCH = "vllm.switch"
ATTR_SWITCH_REASON = "ttft.switch.reason"  # signal | sleep
ATTR_SWITCH_SIGNAL = "ttft.switch.signal"  # SIGTERM | SIGINT
ATTR_SWITCH_PROCESSES = "ttft.switch.processes"  # engine processes waited for
ATTR_SWITCH_PROCESSES_LEFT = "ttft.switch.processes_left"  # still alive when the wait gave up
ATTR_SWITCH_RELEASED_BYTES = "ttft.switch.released_bytes"  # their resident memory at the signal
ATTR_SWITCH_ENGINE_EXIT_S = "ttft.switch.engine_exit_seconds"  # signal -> engine processes gone
SWITCH_REASON_SIGNAL = "signal"
SWITCH_REASON_SLEEP = "sleep"

# The replay client (otel-ttft replay): its own service, its own traces.
REPLAY_SERVICE_NAME = "otel-ttft-replay"
SPAN_REPLAY_RUN = "replay.run"  # one per run; root of its own trace
SPAN_REPLAY_REQUEST = "replay.request"  # CLIENT, root of the request's trace; parent of llm_request
ATTR_REPLAY_RUN_ID = "ttft.replay.run_id"
ATTR_REPLAY_DRIVER = "ttft.replay.driver"  # restart | sleep | resident | proxy
ATTR_REPLAY_MODELS = "ttft.replay.models"  # served model names
ATTR_REPLAY_CLIENT = "ttft.replay.client"
ATTR_REPLAY_SAMPLING = "ttft.replay.sampling"  # JSON: temperature, max_tokens, seed
ATTR_REPLAY_CONCURRENCY = "ttft.replay.concurrency"
ATTR_REPLAY_PROMPTS = "ttft.replay.prompts"  # JSON: {"short": {"tokens", "sha256"}, ...}; no text
ATTR_REPLAY_REPEAT = "ttft.replay.repeat"
ATTR_REPLAY_SCENARIOS = "ttft.replay.scenarios"
ATTR_REPLAY_SCENARIO = "ttft.replay.scenario"
ATTR_REPLAY_REPEAT_INDEX = "ttft.replay.repeat_index"
ATTR_REPLAY_PROMPT = "ttft.replay.prompt"  # short | long
ATTR_REPLAY_SWITCH_FROM = "ttft.replay.switch_from"  # the model served before this request
ATTR_REPLAY_ERROR = "ttft.replay.error"
ATTR_CLIENT_TTFT = "ttft.client.time_to_first_token"  # s: request made -> first content chunk
ATTR_CLIENT_REQUEST_SENT_NS = "ttft.client.request_sent_ns"  # epoch ns (one clock): HTTP sent
# Replay scenarios (the article's five, plus multi-adapter servers), in replay order.
SCENARIO_COLD_SWITCH = "cold-switch"
SCENARIO_SWITCH_BACK = "switch-back"
SCENARIO_RESIDENT_DUAL = "resident-dual"
SCENARIO_SHORT_PROMPT = "short-prompt"
SCENARIO_LONG_PROMPT = "long-prompt"
SCENARIO_ADAPTER_SWITCH = "adapter-switch"
SCENARIOS = (SCENARIO_COLD_SWITCH, SCENARIO_SWITCH_BACK, SCENARIO_RESIDENT_DUAL,
             SCENARIO_SHORT_PROMPT, SCENARIO_LONG_PROMPT, SCENARIO_ADAPTER_SWITCH)
DRIVERS = ("restart", "sleep", "resident", "proxy")

# --- issue 7: alerting on sparse activations, Prometheus names --------------------------------
# Duration of each stage in this process's latest activation (the longest span of that stage in
# it: for a family, its outermost span; for load.read, the slowest shard). A gauge, so an alert can
# compare the latest activation against the model's history without a rate over empty windows.
METRIC_ACTIVATION_STAGE_LAST_DURATION = "ttft.activation.stage.last_duration"  # gauge, s
# Fraction of this process's torch.compile spans in its latest activation that hit the cache
# (ttft.compile.cache_hit); a gauge for the same reason.
METRIC_ACTIVATION_COMPILE_CACHE_HIT_RATIO = "ttft.activation.compile.cache_hit_ratio"  # gauge, 1
# The replay client's TTFT (GenAI semconv client metric, streaming calls): request made -> first
# content chunk, the value of ttft.client.time_to_first_token; TTFT_BUCKETS_S. Attributes:
# gen_ai.operation.name, gen_ai.request.model, ttft.replay.scenario and ttft.request.cold (here:
# the request waited for a switch or a cold start).
METRIC_CLIENT_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"  # histogram, s
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_OPERATION_CHAT = "chat"

# --- issue 11: failures, hangs and an unreachable collector ---------------------------------------
ATTR_ACTIVATION_FAILED_STAGE = "ttft.activation.failed_stage"  # stage the activation died in
ATTR_SPAN_UNFINISHED = "ttft.span.unfinished"  # True on a snapshot copy of a span still open
ATTR_SPAN_ENDED_BY = "ttft.span.ended_by"  # process_exit | SIGTERM | ... | parent: not by vLLM
EVENT_CHILD_DIED = "child process died"  # on the parent's span that was waiting for it
ATTR_CHILD_PID = "ttft.child.pid"
ATTR_CHILD_EXIT_CODE = "ttft.child.exit_code"
ATTR_CHILD_SIGNAL = "ttft.child.signal"  # SIGKILL, ... when a signal ended it
ATTR_CHILD_STAGE = "ttft.child.stage"  # the stage the child was in when it died
ATTR_CHILD_SPAN = "ttft.child.span"  # the innermost span it had open
METRIC_ACTIVATION_STAGE_IN_PROGRESS = "ttft.activation.stage.in_progress"  # gauge, s in stage
METRIC_TELEMETRY_DROPPED = "ttft.telemetry.dropped"  # counter: spans / metric points not sent
ATTR_TELEMETRY_SIGNAL = "ttft.telemetry.signal"  # spans | metrics
ATTR_TELEMETRY_DROP_REASON = "ttft.telemetry.drop_reason"  # queue_full|export_failed|exit_deadline
DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_EXIT_DEADLINE = "exit_deadline"


# --- issue 10: every load format's shard reads, storage evidence, the rest of "Load model" ------
SPAN_LOAD_WEIGHTS = "Load weights"  # vLLM's name; ours for loaders that open none (runai, ...)
SPAN_RELEASE_MEMORY = "Release memory"  # gc.collect / empty_cache inside "Load model"
SPAN_FINALIZE_LAYERWISE = "Finalize layerwise processing"  # online quantization
SPAN_MODEL_EVAL = "model.eval"
SPAN_ONLINE_QUANT_CHECK = "Online quantization check"  # its first call imports the package
ATTR_LOAD_RELEASE_CALL = "ttft.load.release.call"  # gc.collect | empty_cache
ATTR_LOAD_READER = "ttft.load.reader"  # safe_open | threads | torch.load | runai_streamer | ...
ATTR_LOAD_READ_UNION_SECONDS = "ttft.load.read.union_seconds"  # wall time some read was running
ATTR_LOAD_READ_AGGREGATE_GB_PER_S = "ttft.load.read.aggregate_gb_per_s"  # bytes / union seconds
ATTR_CHECKPOINT_BYTES = "ttft.load.checkpoint.bytes"  # on disk, all files of the read kind
ATTR_FS_REMOTE = "ttft.load.fs.remote"  # network or FUSE file system
ATTR_BLOCK_DEVICE = "ttft.load.block_device"  # e.g. nvme0n1, where /sys shows it
ATTR_BLOCK_ROTATIONAL = "ttft.load.block_device.rotational"

# --- issue 9: request path shape ------------------------------------------------------------------
# GenAI conventions on request spans and on the TTFT and stage metrics (gen_ai.operation.name is
# above: chat, or text_completion for /v1/completions and offline generate).
GEN_AI_OPERATION_TEXT_COMPLETION = "text_completion"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_PROVIDER_VLLM = "vllm"
# The engine rejected the request on arrival (vLLM >= 0.33 EngineCoreOutput.error): nothing ran.
ATTR_REQUEST_REJECTED = "ttft.request.rejected"

# --- issue 9 (cost): the request-detail policy ---------------------------------------------------
# An llm_request span carries its TTFT stages as durations (s). By default only the requests that
# need explaining (cold, slow, the model's tail, errors, a sampled share) get a span (with its stage
# children), and those the caller traces; every request is counted in the metrics.
ATTR_REQUEST_STAGE_FRONTEND_SECONDS = "ttft.request.stage.frontend.seconds"  # input + output
ATTR_REQUEST_STAGE_QUEUE_SECONDS = "ttft.request.stage.queue.seconds"
ATTR_REQUEST_STAGE_PREFILL_SECONDS = "ttft.request.stage.prefill.seconds"
ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS = "ttft.request.stage.first_decode.seconds"  # not TTFT
REQUEST_STAGE_SECONDS = {
    STAGE_FRONTEND: ATTR_REQUEST_STAGE_FRONTEND_SECONDS,
    STAGE_QUEUE: ATTR_REQUEST_STAGE_QUEUE_SECONDS,
    STAGE_PREFILL: ATTR_REQUEST_STAGE_PREFILL_SECONDS,
    STAGE_FIRST_DECODE: ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS,
}
ATTR_REQUEST_DETAIL = "ttft.request.detail"  # why the children were built; absent: they were not
DETAIL_ALL, DETAIL_COLD, DETAIL_SLOW, DETAIL_TAIL, DETAIL_ERROR, DETAIL_SAMPLED = (
    "all", "cold", "slow", "tail", "error", "sampled")
DETAIL_AUTO, DETAIL_SPANS, DETAIL_NONE = "auto", "spans", "none"  # the policy's other values
REQUEST_DETAIL_TAIL_QUANTILE = 0.99  # per model, over its latest 256 requests
