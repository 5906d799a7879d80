"""The EngineCore -> API payload: what EngineCore noted about one request until its first output.

It rides back as one entry (``semconv.ENGINE_PAYLOAD_HEADER``) in the ``trace_headers`` of the
request's first ``EngineCoreOutput``, a ``dict[str, str]`` vLLM already sends per output; the API
side removes the entry again before vLLM reads it. The value is a versioned JSON array, so this
module is all the API process needs to read it (no EngineCore hook module imported there), and a
value it does not understand (another version, a client's forged header, garbage) reads as
``None``: the request is then reported without EngineCore's counts. msgspec (a vLLM dependency)
writes and reads it, typed, in a few microseconds on either side, once per request; the API
side takes the entry out of the output at once and reads it when it emits the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import isfinite
from typing import Annotated, Any

import msgspec

VERSION = 4
SCHEDULED, PREEMPTED = "S", "P"  # schedule event kinds (same letters as ``timeline``)


class StepTime(msgspec.Struct, array_like=True, frozen=True):
    """One engine step that ran (part of) a request's prefill, as its worker thread lived it:
    ``execute_model`` and the step's ``sample_tokens`` together."""

    start: float
    """When the worker began the step (``time.monotonic()``)."""
    end: float
    """When it ended."""
    wall: float
    """Seconds the worker's calls for the step took (``end - start`` less the gap between them)."""
    cpu: float
    """Seconds of CPU the worker thread got within them (``time.thread_time()``)."""
    queued: float = 0.0
    """Seconds the worker thread was runnable without a CPU within them (``runqueue``)."""
    queued_before: float = 0.0
    """... and since its previous step, up to this one's start: waking up for this step
    included (the API side counts it only within the gap before the step)."""


class EngineWait(msgspec.Struct, array_like=True, frozen=True):
    """One engine step, from ``Scheduler.schedule`` to the end of ``update_from_output``, and how
    long EngineCore's thread waited on the kernel's run queue within it."""

    start: float
    end: float
    queued: float
    """Seconds the thread was runnable and had no CPU (``runqueue``)."""


class GraphChoice(msgspec.Struct, array_like=True, frozen=True):
    """How vLLM ran the first step of a request's prefill on a GPU with CUDA graphs captured:
    its CUDA-graph dispatch decision for that step."""

    mode: str
    """vLLM's ``CUDAGraphMode`` for the step: ``NONE`` ran outside every graph (eager, or the
    compiled model without a graph: ``compiled``)."""
    tokens: int
    """Tokens in the step."""
    max_captured: int
    """The largest batch, in tokens, a graph captured for mixed (prefill) batches takes: the
    piecewise limit when piecewise graphs run prefills, the full one in full-only mode; 0 when
    no graph can run a prefill (full decode graphs only)."""
    padded: int = 0
    """Tokens the step ran as: the graph's size (its tokens when no graph ran)."""
    max_full: int = 0
    """The largest full graph, in tokens (decode-only graphs included); 0: none."""
    max_piecewise: int = 0
    """The largest batch captured piecewise, in tokens; 0: none."""
    compiled: bool = False
    """The model runs torch.compiled (vLLM's compilation mode is not ``NONE``): a step outside
    every graph ran the compiled model, not eager."""
    source: str = "dispatch"
    """``cudagraph_stats``: mode and padding from vLLM's own per-step record (``--cudagraph-
    metrics``, after data-parallel ranks agreed); ``dispatch``: the dispatcher's answer."""


class GraphDispatch(msgspec.Struct, array_like=True, frozen=True):
    """A worker's note of one step's CUDA-graph decision, for the requests it starts
    (worker -> EngineCore only; EngineCore keeps the choice per request)."""

    choice: GraphChoice
    request_ids: list[str]


class CompileTime(msgspec.Struct, array_like=True, frozen=True):
    """One torch.compile a worker paid inside serving, from Dynamo's start to its end."""

    start: float
    """When Dynamo began (``time.monotonic()``)."""
    end: float
    """When it was done (the backend's compile included)."""
    frame: str
    """What Dynamo compiled, ``file:function`` (empty where it could not be read)."""
    compile_id: str
    """Dynamo's id for it, ``frame/attempt``."""
    recompile: bool
    """The frame had been compiled before (attempt > 0): a guard failed."""
    model_graph: bool
    """vLLM's own model graph was compiled (inside vLLM's ``monitor_torch_compile``), not a
    helper outside the model."""
    step_tokens: int
    """Tokens scheduled in the step it ran in."""
    step_requests: int
    """Requests in that step."""
    compiler: str = "dynamo"
    """``dynamo`` (torch.compile, Inductor's kernels inside it) or ``triton`` (a ``@triton.jit``
    kernel compiled for a new specialization: Triton's own hooks timed it)."""


class AdapterLoad(msgspec.Struct, array_like=True, frozen=True):
    """One LoRA adapter load a worker paid inside serving."""

    start: float
    end: float
    lora_id: int
    """The adapter's ``lora_int_id``: only requests for it waited on the load."""


@dataclass(slots=True)
class PrefillStep:
    """A step a CPU worker timed, and the requests whose prefill it ran."""

    time: StepTime
    request_ids: list[str]


WORKER_NOTES_ATTR = "_otel_ttft_worker"
"""The one way from a worker to EngineCore: this attribute of a step's ``ModelRunnerOutput``
holds a :class:`WorkerNotes` (pickled with the output by the multiproc executor, the same object
in-process), set by ``worker`` where the output is handed back and read by ``engine`` in
``Scheduler.update_from_output``."""


@dataclass(slots=True)
class WorkerNotes:
    """What a worker hands EngineCore with one step's output."""

    notes: list[AdapterLoad | CompileTime | GraphDispatch]
    """Warm-up it timed and CUDA-graph decisions, since the previous output."""
    steps: list[PrefillStep]
    """CPU steps it timed that ran some prefill."""


#: blocks of a prompt whose hashes ride along (vLLM's hash block size each: 16 tokens -> 4,096)
MAX_PREFIX_BLOCKS = 256
PREFIX_HASH_BYTES = 8  # of each vLLM block hash: a 64-bit prefix of its chained digest


class PrefixBlocks(msgspec.Struct, array_like=True, frozen=True):
    """The start of vLLM's own block hashes of a request's prompt (``Request.block_hashes``,
    chained: each fingerprints the whole prefix up to its block's end), for the few requests the
    prefix baseline needs (``engine.EngineRequests.wants_prefix``)."""

    tokens: int
    """Tokens per hashed block (the scheduler's ``hash_block_size``)."""
    digests: bytes
    """The first ``PREFIX_HASH_BYTES`` of each block's hash, in prompt order, end to end (one
    string on the wire: a list of short strings costs EngineCore ten times as much)."""

    @property
    def hashes(self) -> list[bytes]:
        n = PREFIX_HASH_BYTES
        return [self.digests[i:i + n] for i in range(0, len(self.digests), n)]


@dataclass(slots=True)
class EnginePayload:
    """One request as EngineCore saw it (all times ``time.monotonic()`` seconds, host-wide)."""

    queued: float
    """When ``Scheduler.add_request`` received it."""
    waiting: int
    """Requests waiting in the scheduler when it arrived."""
    running: int
    """Requests running when it arrived."""
    free: int
    """Free KV-cache blocks when it arrived."""
    total: int
    """KV-cache blocks in all."""
    attempts: int = 0
    """Admission attempts: prefix-cache lookups made for it while it waited for KV blocks."""
    schedule: list[tuple[str, float]] | tuple[()] = field(default_factory=list)
    """(``SCHEDULED``|``PREEMPTED``, time), stamped by us only when vLLM records no events
    (read in the API process: ``()`` when empty)."""
    adapter: tuple[float, float] | None = None
    """(start, end) of a LoRA adapter load it waited for."""
    compile: list[CompileTime] | tuple[()] = field(default_factory=list)
    """Each torch.compile paid inside its wait for the first token, with what compiled (read in
    the API process: ``()`` when empty)."""
    steps: list[StepTime] | tuple[()] = field(default_factory=list)
    """The worker steps that ran its prefill, timed on a CPU worker (read in the API process:
    ``()`` when empty)."""
    engine_waits: list[EngineWait] | tuple[()] = field(default_factory=list)
    """The engine steps that ran its prefill and in which EngineCore's thread waited for a CPU
    (read in the API process: ``()`` when empty)."""
    graph: GraphChoice | None = None
    """Its first prefill step's CUDA-graph decision (GPU, graphs captured; else ``None``)."""
    lora_id: int = 0
    """Its adapter's ``lora_int_id`` (0: none). EngineCore-side only: not shipped."""
    block_hashes: Any = None
    """vLLM's ``Request.block_hashes`` list (referenced, never copied at arrival) when this
    request's prefix is wanted, with ``hash_tokens``. EngineCore-side only: shipped as
    ``prefix``."""
    hash_tokens: int = 0
    prefix: PrefixBlocks | None = None
    """The API side's reading of them."""


def _prefix_blocks(p: EnginePayload) -> PrefixBlocks | None:
    if not p.block_hashes or p.hash_tokens <= 0:
        return None
    n = PREFIX_HASH_BYTES
    return PrefixBlocks(p.hash_tokens,
                        b"".join([h[:n] for h in p.block_hashes[:MAX_PREFIX_BLOCKS]]))


def encode(p: EnginePayload) -> str:
    """The header value: ``[VERSION, queued, attempts, waiting, running, free, total, schedule,
    adapter, compile, steps, engine_waits, graph, prefix]`` as compact JSON."""
    return _encode(_Wire(VERSION, p.queued, p.attempts, p.waiting, p.running, p.free, p.total,
                         p.schedule, p.adapter, p.compile, p.steps, p.engine_waits,
                         p.graph, _prefix_blocks(p))).decode()


_Count = Annotated[int, msgspec.Meta(ge=0)]
_Time = float
_Interval = tuple[_Time, _Time]


class _Wire(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The header's layout; msgspec checks every type on the way in."""

    version: int
    queued: _Time
    attempts: _Count
    waiting: _Count
    running: _Count
    free: _Count
    total: _Count
    schedule: list[tuple[str, _Time]]
    adapter: _Interval | None
    compile: list[CompileTime]
    steps: list[StepTime]
    engine_waits: list[EngineWait]
    graph: GraphChoice | None
    prefix: PrefixBlocks | None = None


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Wire).decode


def decode(value: str) -> EnginePayload | None:
    """The API side's reading of :func:`encode`; ``None`` for anything else."""
    if not isinstance(value, str) or len(value) > 65536:
        return None
    try:
        w = _decode(value)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    if w.version != VERSION or not isfinite(w.queued):
        return None
    for kind, ts in w.schedule:
        if (kind != SCHEDULED and kind != PREEMPTED) or not isfinite(ts):
            return None
    if any(c.step_tokens < 0 or c.step_requests < 0 or len(c.compiler) > 16
           for c in w.compile):
        return None
    intervals = [(c.start, c.end) for c in w.compile]
    for start, end in intervals if w.adapter is None else [w.adapter, *intervals]:
        if not (isfinite(start) and isfinite(end)):
            return None
    for step in w.steps:
        if not (isfinite(step.start) and isfinite(step.end) and isfinite(step.wall)
                and isfinite(step.cpu) and step.cpu >= 0 and step.wall >= 0
                and isfinite(step.queued) and step.queued >= 0
                and isfinite(step.queued_before) and step.queued_before >= 0):
            return None
    g = w.graph
    if g is not None and (min(g.tokens, g.max_captured, g.padded, g.max_full, g.max_piecewise) < 0
                          or len(g.mode) > 32 or len(g.source) > 32):
        return None
    if w.prefix is not None and (w.prefix.tokens <= 0 or len(w.prefix.digests)
                                 > MAX_PREFIX_BLOCKS * PREFIX_HASH_BYTES
                                 or len(w.prefix.digests) % PREFIX_HASH_BYTES):
        return None
    for wait in w.engine_waits:
        if not (isfinite(wait.start) and isfinite(wait.end) and isfinite(wait.queued)
                and wait.queued >= 0):
            return None
    # Empty lists as the empty tuple (the usual case: vLLM stamps its own events, nothing
    # compiled): the API process keeps a payload as long as its request, untracked by the GC.
    return EnginePayload(w.queued, w.waiting, w.running, w.free, w.total, w.attempts,
                         w.schedule or (), w.adapter, w.compile or (), w.steps or (),
                         w.engine_waits or (), w.graph, prefix=w.prefix)
