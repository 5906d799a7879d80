"""What our processes hand each other about requests, one way each: a worker to EngineCore, one
attribute of the step's ``ModelRunnerOutput`` (:class:`WorkerNotes`, pickled with the output);
EngineCore to the API server, one entry (``semconv.ENGINE_PAYLOAD_HEADER``) in the
``trace_headers`` of the request's first ``EngineCoreOutput``, taken out again before vLLM reads
them. That entry is versioned msgspec JSON, written and read once per request in a few
microseconds; a value this module does not understand (another version, a forged header,
garbage) reads as ``None``, and the request is reported without EngineCore's counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import isfinite
from typing import Annotated, Any

import msgspec

from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED

VERSION = 4


class StepTime(msgspec.Struct, array_like=True):
    """One engine step that ran (part of) a request's prefill, as its worker thread lived it
    (``execute_model`` and the step's ``sample_tokens`` together, added up as they run;
    ``time.monotonic()``)."""

    start: float
    end: float
    wall: float  # seconds the worker's calls took (``end - start`` less the gap between them)
    cpu: float  # seconds of CPU the thread got within them (``time.thread_time()``)
    queued: float = 0.0  # seconds it was runnable without a CPU within them (``runqueue``)
    # ... and since its previous step, up to this one's start (the API side counts it only
    # within the gap before the step)
    queued_before: float = 0.0
    handed: float = 0.0  # when EngineCore handed the step over (``schedule`` returned; 0: not)
    received: float = 0.0  # ... and when it had the step's output (``update_from_output``)
    major_faults: int = 0  # the worker's major page faults since its previous step (``hostwait``)
    steal: float = 0.0  # seconds of the host's steal time since the worker's previous step
    throttled: float = 0.0  # seconds its cgroup was throttled since its previous step


class EngineWait(msgspec.Struct, array_like=True, frozen=True):
    """One engine step (``schedule`` to the end of ``update_from_output``) and how long
    EngineCore's thread was runnable without a CPU within it (``runqueue``)."""

    start: float
    end: float
    queued: float


class GraphChoice(msgspec.Struct, array_like=True, frozen=True):
    """vLLM's CUDA-graph decision for the first step of a request's prefill (GPU, graphs
    captured), in tokens: ``mode``, its ``CUDAGraphMode`` (``NONE``: outside every graph, eager
    or the compiled model without one: ``compiled``); the step's tokens and what it ran as
    (``padded``); the largest graph for mixed (prefill) batches (``max_captured``: the piecewise
    limit when piecewise graphs run prefills, the full one in full-only mode, 0 when only full
    decode graphs exist), the largest full and piecewise ones; ``source``: the dispatcher's
    answer, or vLLM's own per-step record (``cudagraph_stats``, ``--cudagraph-metrics``)."""

    mode: str
    tokens: int
    max_captured: int
    padded: int = 0
    max_full: int = 0
    max_piecewise: int = 0
    compiled: bool = False  # vLLM's compilation mode is not ``NONE``
    source: str = "dispatch"


class GraphDispatch(msgspec.Struct, array_like=True, frozen=True):
    """A worker's note of one step's decision, for the requests the step starts."""

    choice: GraphChoice
    request_ids: list[str]


class CompileTime(msgspec.Struct, array_like=True, frozen=True):
    """One torch.compile a worker paid inside serving, Dynamo's start to its end."""

    start: float
    end: float
    frame: str  # what Dynamo compiled, ``file:function`` (empty where it could not be read)
    compile_id: str  # Dynamo's, ``frame/attempt``
    recompile: bool  # attempt > 0: a guard failed
    model_graph: bool  # vLLM's model graph (inside ``monitor_torch_compile``), not a helper
    step_tokens: int  # tokens and requests of the step it ran in
    step_requests: int
    # ``dynamo`` (torch.compile, Inductor's kernels inside it) or ``triton`` (a ``@triton.jit``
    # kernel compiled for a new specialization: Triton's own hooks timed it)
    compiler: str = "dynamo"


class AdapterLoad(msgspec.Struct, array_like=True, frozen=True):
    """One LoRA adapter load a worker paid inside serving (only requests for ``lora_id``, its
    ``lora_int_id``, waited on it)."""

    start: float
    end: float
    lora_id: int


@dataclass(slots=True)
class PrefillStep:
    """A step a CPU worker timed, and the requests whose prefill it ran."""

    time: StepTime
    request_ids: list[str]


WORKER_NOTES_ATTR = "_otel_ttft_worker"
"""The attribute of a step's ``ModelRunnerOutput`` that holds its :class:`WorkerNotes`: set by
``worker`` where the output is handed back, read by ``engine`` in ``update_from_output``."""


@dataclass(slots=True)
class WorkerNotes:
    """What a worker hands EngineCore with one step's output: warm-up it timed and CUDA-graph
    decisions since the previous output (``notes``), CPU steps it timed that ran some prefill."""

    notes: list[AdapterLoad | CompileTime | GraphDispatch]
    steps: list[PrefillStep]


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
    """One request as EngineCore saw it until its first output (``time.monotonic()`` seconds).
    The lists read in the API process are ``()`` when empty."""

    queued: float  # ``Scheduler.add_request`` received it
    waiting: int  # requests waiting, and running, when it arrived
    running: int
    free: int  # free KV-cache blocks when it arrived, of ``total``
    total: int
    attempts: int = 0  # prefix-cache lookups made for it while it waited for KV blocks
    # (SCHEDULED|PREEMPTED, time), stamped by us only when vLLM records no events
    schedule: list[tuple[str, float]] | tuple[()] = field(default_factory=list)
    adapter: tuple[float, float] | None = None  # a LoRA adapter load it waited for
    compile: list[CompileTime] | tuple[()] = field(default_factory=list)  # paid in its wait
    steps: list[StepTime] | tuple[()] = field(default_factory=list)  # CPU steps of its prefill
    # the engine steps of its prefill in which EngineCore's thread waited for a CPU
    engine_waits: list[EngineWait] | tuple[()] = field(default_factory=list)
    graph: GraphChoice | None = None  # its first prefill step's CUDA-graph decision
    lora_id: int = 0  # its adapter's ``lora_int_id`` (0: none); EngineCore only, not shipped
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


class _Wire(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The header's layout; msgspec checks every type on the way in."""

    version: int
    queued: float
    attempts: _Count
    waiting: _Count
    running: _Count
    free: _Count
    total: _Count
    schedule: list[tuple[str, float]]
    adapter: tuple[float, float] | None
    compile: list[CompileTime]
    steps: list[StepTime]
    engine_waits: list[EngineWait]
    graph: GraphChoice | None
    prefix: PrefixBlocks | None = None


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Wire).decode


def _finite(*values: float) -> bool:
    return all(isfinite(v) for v in values)


def _valid(w: _Wire) -> bool:
    """Every time finite, every count and duration non-negative, every kind known."""
    g = w.graph
    return (w.version == VERSION and isfinite(w.queued)
            and all(k in (SCHEDULED, PREEMPTED) and isfinite(ts) for k, ts in w.schedule)
            and all(c.step_tokens >= 0 and c.step_requests >= 0 and len(c.compiler) <= 16
                    and _finite(c.start, c.end) for c in w.compile)
            and (w.adapter is None or _finite(*w.adapter))
            and all(_finite(s.start, s.end, s.wall, s.cpu, s.queued, s.queued_before)
                    and min(s.wall, s.cpu, s.queued, s.queued_before) >= 0 for s in w.steps)
            and (g is None or (min(g.tokens, g.max_captured, g.padded, g.max_full,
                                   g.max_piecewise) >= 0
                               and len(g.mode) <= 32 and len(g.source) <= 32))
            and all(_finite(e.start, e.end, e.queued) and e.queued >= 0
                    for e in w.engine_waits)
            and (w.prefix is None or (w.prefix.tokens > 0 and len(w.prefix.digests)
                                      <= MAX_PREFIX_BLOCKS * PREFIX_HASH_BYTES
                                      and len(w.prefix.digests) % PREFIX_HASH_BYTES == 0)))


def decode(value: str) -> EnginePayload | None:
    """The API side's reading of :func:`encode`; ``None`` for anything else."""
    if not isinstance(value, str) or len(value) > 65536:
        return None
    try:
        w = _decode(value)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    if not _valid(w):
        return None
    # Empty lists as the empty tuple (the usual case: vLLM stamps its own events, nothing
    # compiled): the API process keeps a payload as long as its request, untracked by the GC.
    return EnginePayload(w.queued, w.waiting, w.running, w.free, w.total, w.attempts,
                         w.schedule or (), w.adapter, w.compile or (), w.steps or (),
                         w.engine_waits or (), w.graph, prefix=w.prefix)
