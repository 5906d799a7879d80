"""The stage vocabulary (DESIGN.md): families, sub-stages (dotted values), the pipeline order a
verdict walks, and which of vLLM's own start-up spans measures which stage."""


#: waiting for the previous model to leave: stop signal or sleep until its engine is gone
STAGE_SWITCH = "switch"
#: vLLM sleep mode: offload or discard weights (EngineCore and worker sleep)
STAGE_SWITCH_SLEEP = "switch.sleep"
STAGE_LOAD = "load"  # loading as a whole (vLLM's Loading, Load model, Load weights spans)
STAGE_LOAD_INIT = "load.init"  # model construction: parameter allocation before weights arrive
STAGE_LOAD_READ = "load.read"  # checkpoint shard reads
STAGE_LOAD_PROCESS = "load.process"  # dequantization / post-processing after loading

STAGE_LOAD_H2D = "load.h2d"  # host-to-device copies (GPU path; wake-up)
STAGE_WARMUP = "warmup"  # start-up containers: EngineCore, executor and worker init, Prepare model
STAGE_WARMUP_PROCESS_START = "warmup.process_start"  # exec -> first vLLM span: imports
STAGE_WARMUP_FRONTEND = "warmup.frontend"  # API server: arg checks, socket, app, tokenizer
#: device-context creation (Init device; ours on CPU)
STAGE_WARMUP_DEVICE_INIT = "warmup.device_init"
STAGE_WARMUP_PROFILE = "warmup.profile"  # memory profiling run (determine_available_memory)
STAGE_WARMUP_COMPILE = "warmup.compile"  # torch.compile, with cache hit or miss and cache dir
#: CUDA graph capture: graphs, batch sizes, memory
STAGE_WARMUP_GRAPH_CAPTURE = "warmup.graph_capture"
STAGE_WARMUP_KV_ALLOC = "warmup.kv_alloc"  # KV-cache allocation: blocks, block size, bytes, tokens
STAGE_WARMUP_ADAPTER = "warmup.adapter"  # LoRA adapter load
#: a torch.compile paid inside a serving step of something outside vLLM's model graph (a sampler
#: helper on first use, a recompile after a guard failed), with what compiled and the step's
#: shape as evidence (vLLM's model compiled in a step is ``warmup.compile``)
STAGE_WARMUP_STEP_COMPILE = "warmup.step_compile"
# A cold request's front-end first use: chat-template compile, tokenizer and detokenizer set-up
#: a cold request's front-end first use: chat-template compile, tokenizer, detokenizer set-up
STAGE_WARMUP_FIRST_USE = "warmup.first_use"
#: engine received -> scheduled: admission blocked on KV blocks, preemption requeues
STAGE_QUEUE = "queue"
STAGE_PREFILL = "prefill"  # scheduled -> first token computed (all prefill chunks)
#: inside a step that ran its prefill, the worker waited for a CPU (its thread ran for less than
#: the step's wall time: another process held the CPU, or the worker was stopped)
STAGE_PREFILL_WAIT = "prefill.wait"
#: prefill spent on prompt tokens the baseline found in the prefix cache for the same prompt
#: and this request computed (a switch emptied the cache): a share of prefill by token count
STAGE_PREFILL_UNCACHED_PREFIX = "prefill.uncached_prefix"
STAGE_FRONTEND = "frontend"  # HTTP arrival -> engine queue, and first token -> handed to HTTP
STAGE_NETWORK = "network"  # client-observed TTFT minus everything the server spans cover
STAGE_FIRST_DECODE = "first_decode"  # first -> second token (reported, not part of TTFT)
#: the design's stage families; every stage value is one or a dotted sub-stage of one
STAGE_FAMILIES = (
    STAGE_SWITCH, STAGE_LOAD, STAGE_WARMUP, STAGE_QUEUE, STAGE_PREFILL,
    STAGE_FRONTEND, STAGE_NETWORK, STAGE_FIRST_DECODE,
)

#: the stages a client TTFT is split into, in pipeline order (the order a verdict walks them)
TTFT_PIPELINE = (
    STAGE_SWITCH, STAGE_LOAD, STAGE_WARMUP, STAGE_FRONTEND, STAGE_QUEUE, STAGE_PREFILL,
    STAGE_NETWORK,
)
#: every stage value, family by family
ALL_STAGES = (
    STAGE_SWITCH, STAGE_SWITCH_SLEEP,
    STAGE_LOAD, STAGE_LOAD_INIT, STAGE_LOAD_READ, STAGE_LOAD_PROCESS, STAGE_LOAD_H2D,
    STAGE_WARMUP, STAGE_WARMUP_PROCESS_START, STAGE_WARMUP_FRONTEND, STAGE_WARMUP_DEVICE_INIT,
    STAGE_WARMUP_PROFILE, STAGE_WARMUP_COMPILE, STAGE_WARMUP_GRAPH_CAPTURE, STAGE_WARMUP_KV_ALLOC,
    STAGE_WARMUP_ADAPTER, STAGE_WARMUP_STEP_COMPILE, STAGE_WARMUP_FIRST_USE,
    STAGE_QUEUE, STAGE_PREFILL, STAGE_PREFILL_WAIT, STAGE_PREFILL_UNCACHED_PREFIX,
    STAGE_FRONTEND, STAGE_NETWORK, STAGE_FIRST_DECODE,
)

def stage_family(stage: str) -> str:
    """``warmup.compile`` -> ``warmup``."""
    return stage.split(".", 1)[0]

#: vLLM 0.32's own @instrument spans -> the stage they measure; tagged on start, never re-opened
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
ATTR_STAGE = "ttft.stage"  # on every stage span: the stage it measures (a value of ALL_STAGES)
