"""Activations (start, wake, adapter) and switches: process and device, warm-up attributes,
the eviction span, failures of a start-up, and the activation metrics."""


#: root of one engine activation (start or wake-up) across the API server, EngineCore and workers
SPAN_ACTIVATION = "vllm.activation"
#: process exec -> its first span: interpreter, imports, argument parsing
SPAN_PROCESS_START = "process start and imports"
#: app build -> uvicorn listening; its end is the activation's ready
SPAN_FRONTEND_SETUP = "API server ready"
SPAN_ENGINE_CONFIG = "Create engine config"  # the API server building vLLM's engine config
#: the API server starting its engine client (EngineCore under it)
SPAN_ENGINE_CLIENT = "Engine client init"
SPAN_DEVICE_INIT = "Init device"  # same name vLLM uses on GPU; opened by us where vLLM has none
SPAN_PROFILE_RUN = "Profile run"  # vLLM's memory profiling run (determine_available_memory)
SPAN_TORCH_COMPILE = "torch.compile"  # one torch.compile, at start-up or inside a request's Prefill
SPAN_KV_ALLOC = "Allocate KV cache"  # vLLM's span; we enrich it with the ttft.kv.* attributes
#: vLLM's span around V1's graph capture; ours, under the same name, for the runners without it
SPAN_GRAPH_CAPTURE = "Capture model"
#: vLLM's span around V1's model load on a GPU; ours, same name, for runners without it (V2)
SPAN_LOADING_GPU = "Loading (GPU)"
SPAN_LOADING_CPU = "Loading (CPU)"  # the same on a CPU (vLLM's on the V1 CPU runner)
SPAN_SLEEP = "Sleep"  # EngineCore and worker sleep (sleep mode); ends when the sleep completes
SPAN_WAKE_UP = "Wake up"  # EngineCore and worker wake-up from sleep (load.h2d)
SPAN_ADAPTER_LOAD = "Load LoRA adapter"  # a LoRA adapter loaded for a request (under its Prefill)
ATTR_PROCESS_KIND = "ttft.process.kind"  # on our spans and tagged vLLM spans: PROCESS_KINDS
PROCESS_API_SERVER = "api_server"  # ttft.process.kind of the API server process
PROCESS_ENGINE_CORE = "engine_core"  # ttft.process.kind of the EngineCore process
PROCESS_WORKER = "worker"  # ttft.process.kind of a worker process
#: the values of ttft.process.kind
PROCESS_KINDS = (PROCESS_API_SERVER, PROCESS_ENGINE_CORE, PROCESS_WORKER)
ATTR_ACTIVATION_KIND = "ttft.activation.kind"  # on vllm.activation: start | wake | adapter
ATTR_ACTIVATION_READY = "ttft.activation.ready"  # bool: the server reached ready
#: GenAI: served model (or LoRA adapter) name, on spans and metrics
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
#: OTel: the process id, on vllm.activation, process start and vllm.switch
PROCESS_PID = "process.pid"

# device and warm-up
ATTR_DEVICE_TYPE = "ttft.device.type"  # on Init device (ours, CPU): the device type
ATTR_DEVICE_NAME = "ttft.device.name"  # on Init device (ours, CPU): the CPU model
ATTR_DEVICE_MEMORY_BYTES = "ttft.device.memory_bytes"  # total device memory (host RAM on CPU)
ATTR_HOST_MEMORY_BYTES = "ttft.host.memory_bytes"  # total host RAM (where sleep level 1 offloads)
ATTR_COMPILE_MODE = "ttft.compile.mode"  # on torch.compile: vLLM's compilation mode
#: on torch.compile: artifacts loaded from cache and nothing compiled
ATTR_COMPILE_CACHE_HIT = "ttft.compile.cache_hit"
ATTR_COMPILE_CACHE_DIR = "ttft.compile.cache_dir"  # on torch.compile: the compile cache directory
ATTR_COMPILE_GRAPHS = "ttft.compile.graphs"  # on torch.compile: backend compilations in it
#: on torch.compile: the compile ranges (or sizes) vLLM compiles for
ATTR_COMPILE_RANGES = "ttft.compile.ranges"
ATTR_COMPILE_AOT_LOAD_ATTEMPT = "ttft.compile.aot_load_attempt"  # True: loading a cached artifact
#: on Profile run: memory left for the KV cache after profiling
ATTR_PROFILE_AVAILABLE_KV_BYTES = "ttft.profile.available_kv_bytes"
#: on Capture model: CUDA graphs the capture made, vLLM's own counter: each full graph once, each
#: piecewise capture once per piece (a piece per layer or so: hundreds for one batch size)
ATTR_GRAPH_COUNT = "ttft.graph.count"
#: on Capture model: every batch size, in tokens, captured in either mode (largest first)
ATTR_GRAPH_BATCH_SIZES = "ttft.graph.batch_sizes"
#: on Capture model: device memory the graphs took (the driver's reading; V2: vLLM's own figure)
ATTR_GRAPH_MEMORY_BYTES = "ttft.graph.memory_bytes"
ATTR_GRAPH_FULL_COUNT = "ttft.graph.full.count"  # on Capture model: full graphs (one per shape)
#: on Capture model: the batch sizes captured as full graphs (largest first)
ATTR_GRAPH_FULL_BATCH_SIZES = "ttft.graph.full.batch_sizes"
#: on Capture model: device memory the full captures took (driver, around them)
ATTR_GRAPH_FULL_MEMORY_BYTES = "ttft.graph.full.memory_bytes"
#: on Capture model: batch sizes captured piecewise (each a set of pieces)
ATTR_GRAPH_PIECEWISE_COUNT = "ttft.graph.piecewise.count"
#: on Capture model: the batch sizes captured piecewise (largest first)
ATTR_GRAPH_PIECEWISE_BATCH_SIZES = "ttft.graph.piecewise.batch_sizes"
#: on Capture model: CUDA graphs the piecewise captures made (pieces x batch sizes)
ATTR_GRAPH_PIECEWISE_PIECES = "ttft.graph.piecewise.pieces"
#: on Capture model: device memory the piecewise captures took (driver, around them)
ATTR_GRAPH_PIECEWISE_MEMORY_BYTES = "ttft.graph.piecewise.memory_bytes"
ATTR_KV_BLOCKS = "ttft.kv.blocks"  # on Allocate KV cache: KV blocks
ATTR_KV_BLOCK_SIZE = "ttft.kv.block_size"  # on Allocate KV cache: tokens per block
ATTR_KV_BYTES = "ttft.kv.bytes"  # on Allocate KV cache: bytes allocated
ATTR_KV_TOKEN_CAPACITY = "ttft.kv.token_capacity"  # on Allocate KV cache: tokens the cache holds
#: on Loading, Profile run, Allocate KV cache, Capture model: the model runner class that ran it
#: (module.Class: V1 ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``, V2
#: ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, the CPU runners, ...)
ATTR_MODEL_RUNNER = "ttft.model_runner"
#: beside ttft.model_runner: why vLLM chose it (``VLLM_USE_V2_MODEL_RUNNER=0``, "Model Runner V2
#: does not yet support ...", "default", ...), from its ``VllmConfig.use_v2_model_runner`` logic
ATTR_MODEL_RUNNER_REASON = "ttft.model_runner.reason"
#: on Sleep: vLLM's sleep level (1 offloads weights, 2 discards them)
ATTR_SLEEP_LEVEL = "ttft.sleep.level"
ATTR_WAKE_TAGS = "ttft.wake.tags"  # on Wake up: what was woken (weights, kv_cache), or all
#: histogram, s (ACTIVATION_DURATION_BUCKETS_S), by ttft.stage and gen_ai.request.model: every
#: start-up stage span (a family's value is its container span's total)
METRIC_ACTIVATION_STAGE_DURATION = "ttft.activation.stage.duration"

#: explicit buckets of ttft.activation.stage.duration, far above 10 s: cold starts of large models
#: take minutes
ACTIVATION_DURATION_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200,
    1800, 3600,
)

#: eviction, in the outgoing API server: its stop signal (or a sleep request) until its engine
#: processes are gone (or asleep); its own trace, joined to a request by time
SPAN_SWITCH = "vllm.switch"
ATTR_SWITCH_REASON = "ttft.switch.reason"  # signal | sleep
ATTR_SWITCH_SIGNAL = "ttft.switch.signal"  # SIGTERM | SIGINT
ATTR_SWITCH_PROCESSES = "ttft.switch.processes"  # engine processes waited for
ATTR_SWITCH_PROCESSES_LEFT = "ttft.switch.processes_left"  # still alive when the wait gave up
ATTR_SWITCH_RELEASED_BYTES = "ttft.switch.released_bytes"  # their resident memory at the signal
ATTR_SWITCH_ENGINE_EXIT_S = "ttft.switch.engine_exit_seconds"  # signal -> engine processes gone
SWITCH_REASON_SIGNAL = "signal"  # ttft.switch.reason: a stop signal (restart)
SWITCH_REASON_SLEEP = "sleep"  # ttft.switch.reason: a sleep request

#: gauge, s, by ttft.stage and gen_ai.request.model: each stage in this process's latest
#: activation (its longest span of that stage: for a family the outermost, for load.read the
#: slowest shard). A gauge, so an alert can compare the latest activation against the model's
#: history without a rate over empty windows
METRIC_ACTIVATION_STAGE_LAST_DURATION = "ttft.activation.stage.last_duration"

#: gauge, 0..1, by gen_ai.request.model: share of this process's torch.compile spans in its
#: latest activation that hit the cache (ttft.compile.cache_hit); a gauge for the same reason
METRIC_ACTIVATION_COMPILE_CACHE_HIT_RATIO = "ttft.activation.compile.cache_hit_ratio"
ATTR_ACTIVATION_FAILED_STAGE = "ttft.activation.failed_stage"  # stage a failed activation died in
EVENT_CHILD_DIED = "child process died"  # on the parent's span that was waiting for it
ATTR_CHILD_PID = "ttft.child.pid"  # the dead child's process id
ATTR_CHILD_EXIT_CODE = "ttft.child.exit_code"  # the dead child's exit code
ATTR_CHILD_SIGNAL = "ttft.child.signal"  # SIGKILL, ... when a signal ended it
ATTR_CHILD_STAGE = "ttft.child.stage"  # the stage the child was in when it died
ATTR_CHILD_SPAN = "ttft.child.span"  # the innermost span it had open
#: observable gauge, s, by ttft.stage, gen_ai.request.model and ttft.process.kind: time in the
#: stage this process is in now, reported only while an activation runs
METRIC_ACTIVATION_STAGE_IN_PROGRESS = "ttft.activation.stage.in_progress"

# the live verdict: each activation against the earlier ones of its model on this host
#: a short child of vllm.activation with one verdict (ttft.verdict.*): at ready, and again once
#: the activation's cold requests are done; judged in a thread after ready, when the activation
#: span has ended
SPAN_ACTIVATION_VERDICT = "vllm.activation.verdict"
#: on vllm.activation.verdict: when the verdict was taken (VERDICT_PHASES)
ATTR_VERDICT_PHASE = "ttft.verdict.phase"
VERDICT_PHASE_READY = "ready"  # ttft.verdict.phase: the server is ready (start -> ready)
#: ttft.verdict.phase: the activation's cold requests are done (their warm-up counts too)
VERDICT_PHASE_COLD_REQUESTS = "cold_requests"
#: the values of ttft.verdict.phase
VERDICT_PHASES = (VERDICT_PHASE_READY, VERDICT_PHASE_COLD_REQUESTS)
#: expanded | within-noise | no-baseline: a stage grew, nothing grew beyond the noise, or this is
#: the first activation of its model and configuration on the host
ATTR_VERDICT_OUTCOME = "ttft.verdict.outcome"
VERDICT_NO_BASELINE = "no-baseline"  # ttft.verdict.outcome: no earlier activation to compare
#: none | thin | measured: no earlier activation, fewer than 3 (the alert thresholds judge), or
#: enough to measure the noise
ATTR_VERDICT_BASELINE = "ttft.verdict.baseline"
ATTR_VERDICT_BASELINE_COUNT = "ttft.verdict.baseline_count"  # earlier activations compared with
ATTR_VERDICT_STAGE = "ttft.verdict.stage"  # the earliest stage family that expanded, or none
ATTR_VERDICT_SUBSTAGE = "ttft.verdict.substage"  # its sub-stage that grew most (warmup.compile)
ATTR_VERDICT_INCREASE_S = "ttft.verdict.increase_seconds"  # that stage's increase, s
#: the sub-stage's own increase, s (part of ttft.verdict.increase_seconds)
ATTR_VERDICT_SUBSTAGE_INCREASE_S = "ttft.verdict.substage_increase_seconds"
ATTR_VERDICT_DURATION_S = "ttft.verdict.duration_seconds"  # this activation, s (start -> phase)
#: median duration of the earlier activations compared with, s
ATTR_VERDICT_BASELINE_S = "ttft.verdict.baseline_seconds"
ATTR_VERDICT_LAST_S = "ttft.verdict.last_seconds"  # the previous activation's duration, s
ATTR_VERDICT_BEST_S = "ttft.verdict.best_seconds"  # the fastest earlier activation's duration, s
#: on the cold-requests verdict: prompt tokens its cold requests read from vLLM's prefix cache
ATTR_VERDICT_COLD_CACHED_TOKENS = "ttft.verdict.cold.cached_tokens"
#: ... and those the earlier starts' cold requests read from it that these computed
ATTR_VERDICT_COLD_UNCACHED_PREFIX_TOKENS = "ttft.verdict.cold.uncached_prefix_tokens"
#: keep-resident | persist-artifacts | warm-up | tune-admission | tune-context | none
ATTR_VERDICT_RECOMMENDATION = "ttft.verdict.recommendation"
ATTR_VERDICT_FIX = "ttft.verdict.fix"  # what to change, in words
#: string array: the change in the installed vLLM's own flags and environment variables
ATTR_VERDICT_CHANGE = "ttft.verdict.change"
ATTR_VERDICT_SUMMARY = "ttft.verdict.summary"  # the verdict in plain words (the log line)
#: gauge, s, per API process: the blamed stage's increase in its latest verdict (0 without one),
#: labelled ttft.stage (the stage blamed, or none), gen_ai.request.model, ttft.verdict.substage,
#: ttft.verdict.recommendation, ttft.verdict.change (joined), ttft.verdict.outcome,
#: ttft.verdict.baseline, ttft.verdict.phase and ttft.activation.trace_id
METRIC_ACTIVATION_VERDICT = "ttft.activation.verdict"
#: on ttft.activation.verdict: the activation's trace id (32 hex), the dashboard's trace link
ATTR_ACTIVATION_TRACE_ID = "ttft.activation.trace_id"
