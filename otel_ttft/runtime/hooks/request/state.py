"""The API process's record of one request, from ``OutputProcessor.add_request`` until it is
emitted, and the book that holds the records (times: ``time.monotonic()`` seconds, host-wide)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from opentelemetry import context as otel_context

from otel_ttft.runtime.hooks.request import payload
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED
from otel_ttft.semconv import ENGINE_PAYLOAD_HEADER as PAYLOAD_HEADER


@cache
def _event_types() -> tuple[int, int, int]:
    """vLLM's ``EngineCoreEventType`` values for QUEUED, SCHEDULED, PREEMPTED, looked up once."""
    from vllm.v1.engine import EngineCoreEventType as T

    return int(T.QUEUED), int(T.SCHEDULED), int(T.PREEMPTED)


@dataclass(slots=True, eq=False)
class RequestRecord:
    """One engine request, from ``OutputProcessor.add_request`` until its span is emitted."""

    rid: str  # vLLM's internal request id
    ext_id: str  # the external (client-facing) request id
    arrival: float  # vLLM's arrival time: the request span's start
    context: otel_context.Context | None = None  # current when vLLM took it (a server span?)
    queue: Any = None  # vLLM's RequestOutputCollector, when a generate call consumes outputs
    streaming: bool = False  # outputs stream: TTFT ends at the first chunk written
    flush: FirstChunk | None = None  # the streaming response's box
    texts: dict[int, str] | None = None  # output text per choice (content capture only)
    model: str | None = None  # served model or LoRA adapter name
    state: Any = None  # vLLM's RequestState, until the request ends (``read_end``)
    params: Any = None  # vLLM's SamplingParams (None: pooling)
    prompt_len: int | None = None
    prompt: str | None = None  # content capture only
    lora: Any = None  # vLLM's LoRARequest
    trace_headers: Any = None  # as the caller sent them (the parent of offline requests)
    queued: float | None = None  # EngineCore received it (vLLM's QUEUED)
    schedule: list[tuple[str, float]] = field(default_factory=list)  # (SCHEDULED|PREEMPTED, t)
    first_tok: float | None = None  # EngineCore's time of the step with the first token
    second_tok: float | None = None  # ... and the second (``first_decode``)
    recv: float | None = None  # the API process received the first output
    out_tokens: int = 0
    cached: int | None = None  # prompt tokens from the prefix cache
    engine: EnginePayload | None = None  # what EngineCore noted (``payload``)
    late_preemptions: list[float] = field(default_factory=list)  # after the first token
    preemptions: int | None = None  # vLLM's own count (its stats logging on)
    finish: Any = None  # vLLM's FinishReason, or a str
    rejected: str | None = None  # vLLM's error when the engine refused it on arrival
    aborted: bool = False
    error: str | None = None  # an engine failure that reached it
    done: float | None = None  # the OutputProcessor let it go
    vllm: dict[str, Any] | None = None  # vLLM's own llm_request attributes (its tracing on)
    cold: bool = False  # among the first after an activation, or waited for warm-up work
    cold_index: int = 0  # its position since the latest activation (1 = first)
    activation: Any = None  # the latest activation when it arrived (``hooks.activation``)

    def on_first(self, eco: Any, ts: float, now: float) -> None:
        """Its first output: when it came, EngineCore's payload, events, cached tokens."""
        self.recv = now
        error = getattr(eco, "error", None)  # vLLM >= 0.33: rejected on arrival, nothing ran
        if error is not None:
            self.rejected = f"{getattr(error, 'code', 'error')}: {getattr(error, 'message', '')}"
        elif eco.new_token_ids or getattr(eco, "pooling_output", None) is not None:
            self.first_tok = ts
        self.out_tokens += len(eco.new_token_ids)
        if eco.events:
            self.on_events(eco.events)
        headers = eco.trace_headers
        if headers and PAYLOAD_HEADER in headers:  # taken out before vLLM reads the headers
            self.engine = payload.decode(headers[PAYLOAD_HEADER])
            eco.trace_headers = {k: v for k, v in headers.items() if k != PAYLOAD_HEADER} or None
        stats = getattr(eco, "prefill_stats", None)
        if stats is not None:
            self.cached = stats.num_cached_tokens
        if eco.finish_reason is not None:
            self.finish = eco.finish_reason

    def on_output(self, eco: Any, ts: float) -> None:
        """A later output: the second token, events, the finish."""
        n = len(eco.new_token_ids)
        self.out_tokens += n
        if n and self.second_tok is None:
            self.second_tok = ts
        if eco.events is not None:
            self.on_events(eco.events)
        if eco.finish_reason is not None:
            self.finish = eco.finish_reason

    def on_events(self, events: Any) -> None:
        queued, scheduled, preempted = _event_types()
        for ev in events:
            kind, ts = int(ev.type), ev.timestamp
            late = self.first_tok is not None and ts >= self.first_tok
            if kind == queued:
                if self.queued is None:
                    self.queued = ts
            elif kind == scheduled and not late:  # a re-admission after the first token: none
                self.schedule.append((SCHEDULED, ts))
            elif kind == preempted:
                if late:
                    self.late_preemptions.append(ts)
                else:
                    self.schedule.append((PREEMPTED, ts))

    def read_end(self, now: float) -> None:
        """What vLLM kept of it, read once as it lets go: its counts, and the usual QUEUED and
        SCHEDULED from its stats where no event said them."""
        self.done = self.done or now
        req_state, self.state = self.state, None
        stats = getattr(req_state, "stats", None)
        if stats is not None:
            self.out_tokens = stats.num_generation_tokens or self.out_tokens
            self.preemptions = stats.num_preemptions
            if self.queued is None and stats.queued_ts:
                self.queued = stats.queued_ts
            if not self.schedule and stats.scheduled_ts:
                self.schedule.append((SCHEDULED, stats.scheduled_ts))
        else:
            detokenizer = getattr(req_state, "detokenizer", None)
            if detokenizer is not None:
                self.out_tokens = detokenizer.num_output_tokens() or self.out_tokens

    def first_flush(self) -> float | None:
        """When the chunk with its first token left the server, if known."""
        return self.flush.first if self.flush is not None else None

    def taken(self) -> bool:
        """Its ``generate`` call took the final output (or nobody consumes a queue)."""
        return self.queue is None or self.queue.output is None


_MAX_LIVE = 65536


class Requests:
    """The records of this process: ``live`` from arrival until vLLM lets the request go,
    ``fresh`` (the live ones still waiting for their first or second token: the only ones a
    step's outputs are looked up for), ``settling`` (ended, its final output not yet taken by
    its ``generate`` call)."""

    def __init__(self) -> None:
        self.live: dict[str, RequestRecord] = {}
        self.fresh: dict[str, RequestRecord] = {}
        self.settling: dict[str, RequestRecord] = {}

    def add(self, rec: RequestRecord) -> None:
        if len(self.live) >= _MAX_LIVE:  # requests vLLM never ended through a hook of ours
            for rid in list(self.live)[: _MAX_LIVE // 2]:
                self.forget(rid)
        self.live[rec.rid] = rec
        self.fresh[rec.rid] = rec

    def watched(self, rid: str) -> None:
        """Its first outputs are all seen: a step's outputs are no longer looked up for it."""
        self.fresh.pop(rid, None)

    def forget(self, rid: str) -> RequestRecord | None:
        self.fresh.pop(rid, None)
        return self.live.pop(rid, None)

    def clear(self) -> None:
        self.live.clear()
        self.fresh.clear()
        self.settling.clear()


class FirstChunk:
    """One streaming response: ``armed`` once its request's first output reached the API
    process (``RequestRecord.on_first``), ``first`` when the next body chunk was written."""

    __slots__ = ("armed", "first")

    def __init__(self) -> None:
        self.armed = False
        self.first: float | None = None


FLUSH: contextvars.ContextVar[FirstChunk | None] = contextvars.ContextVar("otel_ttft_flush",
                                                                         default=None)
"""The box of the streaming HTTP response this task writes, if any (read by ``add_request``,
which runs in the response's task)."""
CALLER_HEADERS: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_ttft_caller",
                                                                   default=None)
"""The ``trace_headers`` of this task's latest ``AsyncLLM.add_request`` call, as the caller sent
them (vLLM drops them when its own tracing is off; they name the caller's trace)."""
TEXTS: contextvars.ContextVar[dict[int, str] | None] = contextvars.ContextVar(
    "otel_ttft_texts", default=None)
"""Content capture only: the texts of the ``generate`` call whose first step is running."""
