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
SPAN_H2D = "Host-to-device copy"
SPAN_DEVICE_INIT = "Init device"  # same name vLLM uses on GPU; opened by us where vLLM has none
SPAN_PROFILE_RUN = "Profile run"
SPAN_TORCH_COMPILE = "torch.compile"
SPAN_GRAPH_CAPTURE = "Capture model"  # vLLM's name; we enrich it
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
GEN_AI_SYSTEM = "gen_ai.system"
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
ENV_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ENV_DISABLED_HOOKS = "OTEL_TTFT_DISABLED_HOOKS"  # comma-separated hook names
