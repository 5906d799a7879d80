"""Per-request state in the API process: the record of one engine request, from
``OutputProcessor.add_request`` until it is emitted. Times are ``time.monotonic()`` seconds
(host-wide: EngineCore's compare)."""

from __future__ import annotations

import contextvars
from functools import cache
from typing import Any

import msgspec
from opentelemetry import context as otel_context

from otel_ttft.runtime import config
from otel_ttft.runtime.hooks.request import payload
from otel_ttft.runtime.hooks.request.flush import ARMED
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED
from otel_ttft.semconv import ENGINE_PAYLOAD_HEADER as PAYLOAD_HEADER


@cache
def _event_types() -> tuple[int, int, int]:
    """vLLM's ``EngineCoreEventType`` values for QUEUED, SCHEDULED, PREEMPTED, looked up once."""
    from vllm.v1.engine import EngineCoreEventType as T

    return int(T.QUEUED), int(T.SCHEDULED), int(T.PREEMPTED)


def telemetry_on() -> bool:
    """Whether a tracer or meter provider exists yet: without one, tracking would be waste."""
    global telemetry_seen
    if not telemetry_seen:
        telemetry_seen = config.tracing_ready() or config.metrics_ready()
    return telemetry_seen


telemetry_seen = False
"""A provider was seen (``telemetry_on``): once true, the per-request hooks read this flag
instead of calling (a frame less per request, with the API server's caches cold)."""


class RequestRecord(msgspec.Struct, gc=False, eq=False):
    """One engine request, from ``OutputProcessor.add_request`` until its span is emitted.

    Not tracked by the garbage collector: a record outlives its request by the emission delay,
    and every tracked object that outlives a young collection brings the busy API server's next
    one closer. The one reference cycle through it (vLLM's request state -> its logprobs
    processor -> our ``FirstOutputs`` -> the record -> the request state) is broken by
    ``unwatch`` at the second token or the end, as ``forget`` does for every record that leaves
    ``live``."""

    rid: str
    """vLLM's internal request id."""
    ext_id: str
    """The external (client-facing) request id."""
    arrival: float
    """vLLM's arrival time (the request span's start)."""
    context: otel_context.Context | None = None
    """The context current when vLLM took the request (in ``generate``'s task: the HTTP server
    span, if any), for the parent and the sampled share."""
    queue: Any = None
    """vLLM's ``RequestOutputCollector`` when a ``generate`` call consumes the outputs; ``None``
    for offline ``LLMEngine`` requests, and once ``taken``."""
    taken: bool = False
    """Its ``generate`` call took the final output (and ``queue`` was let go)."""
    streaming: bool = False
    """Outputs stream to the client (TTFT ends at the first chunk written, not at the last)."""
    flush: Any = None
    """The ``send`` of the HTTP response streaming this request, if any (``flush.ResponseSend``:
    ``arm()`` at the first output, then ``first``, when that output's chunk was written); let go
    once the request ends, its first chunk written (``flushed``)."""
    flushed: float | None = None
    """When the chunk with its first token left, once ``flush`` is let go."""
    texts: dict[int, str] | None = None
    """Output text per choice of its ``generate`` call; only with content capture opted in."""
    model: str | None = None
    """Served model or LoRA adapter name."""
    state: Any = None
    """vLLM's ``RequestState`` (its token counts are read once, when the request ends)."""
    params: Any = None
    """The values of vLLM's ``SamplingParams`` its span may carry (a tuple,
    ``attributes.param_values``), read when it arrives: the ``SamplingParams`` (and the lists
    it holds) is not kept while the request waits to be emitted."""
    prompt_len: int | None = None
    """Prompt tokens."""
    prompt: str | None = None
    """Prompt text; only with content capture opted in."""
    lora: Any = None
    """vLLM's ``LoRARequest``, if any."""
    trace_headers: Any = None
    """The request's ``trace_headers`` (parent of offline requests)."""
    queued: float | None = None
    """vLLM's QUEUED event time (EngineCore received it): from its first output's events, or,
    watched, from vLLM's stats at its end (``settle.end``: the same event)."""
    scheduled: float | None = None
    """vLLM's SCHEDULED event time while it is the only scheduling event (``schedule_events``):
    a float, where a list would be one more object the garbage collector tracks for as long as
    the request waits to be emitted."""
    schedule: list[tuple[str, float]] | None = None
    """(``SCHEDULED``|``PREEMPTED``, time) before the first token once there are more than one
    (a preemption, a second admission); read through ``schedule_events``."""
    first_tok: float | None = None
    """EngineCore's timestamp of the step that produced the first token."""
    second_tok: float | None = None
    """The same for the second token (``first_decode``)."""
    recv: float | None = None
    """When the API process received the first output."""
    out_tokens: int = 0
    """Output tokens: those of its first outputs, then vLLM's count when it ends."""
    cached: int | None = None
    """Prompt tokens served from the prefix cache."""
    engine: EnginePayload | None = None
    """What EngineCore noted (queue depth, KV blocks, admission attempts, warm-up)."""
    late_preemptions: list[float] | tuple[()] = ()
    """Preemptions after the first token seen in its outputs (span events, not segments); after
    its second token its outputs are no longer looked at. A list only once there is one: every
    object a record holds lives as long as the request and its emission, and each one the
    garbage collector tracks brings its next collection closer."""
    preemptions: int | None = None
    """vLLM's own count of its preemptions (with its stats logging on), read when it ends."""
    finish: Any = None
    """The engine's finish reason: vLLM's ``FinishReason`` as it came (its ``str`` is the
    attribute: turned into one when the span is built, not in the busy step), or a ``str``."""
    rejected: str | None = None
    """vLLM's error when the engine rejected it on arrival (``EngineCoreOutput.error``)."""
    aborted: bool = False
    """Aborted before its final output reached the caller."""
    error: str | None = None
    """An engine failure that reached it."""
    done: float | None = None
    """When the OutputProcessor let it go."""
    vllm: dict[str, Any] | None = None
    """vLLM's own ``llm_request`` attributes, when its tracing is on."""
    cold: bool = False
    """It paid for an activation: among the first requests after one, or it waited for
    warm-up work."""
    cold_index: int = 0
    """Its position among the requests since the latest activation (1 = first)."""
    activation: Any = None
    """The latest activation (``hooks.activation``) when it arrived."""
    watch: Any = None
    """vLLM's ``LogprobsProcessor`` of this request while our ``FirstOutputs`` shadows its
    ``update_from_output`` (until its second token, or its end: ``unwatch``)."""
    sampled: bool = False
    """Drawn for the sampled share when it arrived (a warm request without a caller's trace,
    which otherwise gets no record: ``api._counted_at_end``)."""
    from_stats: bool = False
    """Made when it ended, from vLLM's ``RequestStateStats`` alone (``settle.end_from_stats``):
    no EngineCore payload, first chunk's write, second token or sampling parameters."""
    payload_due: str | None = None
    """EngineCore's payload as it came (a ``str``), decoded when the request is emitted
    (``read_payload``): in a batch, where that code runs warm; in the busy server's step it
    runs with its caches cold, several times slower."""

    # -- what the first output says (once) -------------------------------------------------------
    def on_first(self, eco: Any, ts: float, now: float) -> None:
        self.recv = now
        if self.flush is not None:  # the next body chunk of its response carries this output
            self.flush.__class__ = ARMED  # ``ResponseSend.arm``, without its frame
        error = getattr(eco, "error", None)  # vLLM >= 0.33: rejected on arrival, nothing ran
        if error is not None:
            self.rejected = f"{getattr(error, 'code', 'error')}: {getattr(error, 'message', '')}"
        elif eco.new_token_ids or getattr(eco, "pooling_output", None) is not None:
            self.first_tok = ts
        self.out_tokens += len(eco.new_token_ids)
        events = eco.events
        # Watched, vLLM keeps stats: its usual QUEUED and SCHEDULED are also its stats'
        # ``queued_ts`` and ``scheduled_ts``, read at the end (``settle.end``). Only more
        # events (a preemption before the first token) are read here, as unwatched ones are.
        if events and (len(events) > 2 or self.watch is None):
            self.on_events(events)
        headers = eco.trace_headers
        if headers and PAYLOAD_HEADER in headers:
            self.payload_due = headers[PAYLOAD_HEADER]
            eco.trace_headers = ({k: v for k, v in headers.items() if k != PAYLOAD_HEADER}
                                 if len(headers) > 1 else None)
        stats = getattr(eco, "prefill_stats", None)
        if stats is not None:
            self.cached = stats.num_cached_tokens
        if eco.finish_reason is not None:
            self.finish = eco.finish_reason

    def on_output(self, eco: Any, ts: float) -> None:
        """A later output that carries news: the second token, events or the finish."""
        n = len(eco.new_token_ids)
        self.out_tokens += n
        if n and self.second_tok is None:
            self.second_tok = ts
            if self.watch is None:  # looked at every step (``fresh``), not on its processor
                fresh.pop(self.rid, None)
        if eco.events is not None:
            self.on_events(eco.events)
        if eco.finish_reason is not None:
            self.finish = eco.finish_reason

    def unwatch(self) -> None:
        """vLLM's own ``update_from_output`` again for this request (and no reference cycle:
        vLLM's request state -> its processor -> ours -> this record -> vLLM's request state)."""
        processor, self.watch = self.watch, None
        if processor is not None:
            try:  # noqa: SIM105 - once per request: no context manager
                del processor.update_from_output  # not through ``vars()``: see ``api._watch``
            except AttributeError:
                pass

    def events_from_stats(self, stats: Any) -> None:
        """Its usual QUEUED and SCHEDULED times from vLLM's stats (``RequestStateStats``), where
        its first output's events were not read (``on_first``, watched): the same two events.
        ``settle.end`` does the same in line."""
        if self.queued is None and self.schedule is None and self.scheduled is None:
            self.queued = stats.queued_ts or None  # 0.0: none came
            self.scheduled = stats.scheduled_ts or None

    def first_flush(self) -> float | None:
        """When the chunk with its first token left the server, if known."""
        return self.flush.first if self.flush is not None else self.flushed

    def read_payload(self) -> None:
        """EngineCore's payload, decoded once (``engine``)."""
        if self.payload_due is not None:
            value, self.payload_due = self.payload_due, None
            self.engine = payload.decode(value)

    def schedule_events(self) -> list[tuple[str, float]]:
        """(``SCHEDULED``|``PREEMPTED``, time) before the first token, from vLLM's events."""
        if self.schedule is not None:
            return self.schedule
        return [] if self.scheduled is None else [(SCHEDULED, self.scheduled)]

    def on_events(self, events: Any) -> None:
        queued, scheduled, preempted = _event_types()
        for ev in events:
            kind = int(ev.type)
            if kind == queued:
                if self.queued is None:
                    self.queued = ev.timestamp
            elif kind == scheduled:
                if self.first_tok is not None and ev.timestamp >= self.first_tok:
                    continue  # a re-admission after a late preemption: it tiles nothing
                if self.scheduled is None and self.schedule is None:  # the usual case
                    self.scheduled = ev.timestamp
                else:
                    self.schedule = [*self.schedule_events(), (SCHEDULED, ev.timestamp)]
                    self.scheduled = None
            elif kind == preempted:
                if self.first_tok is not None and ev.timestamp >= self.first_tok:
                    self.late_preemptions = [*self.late_preemptions, ev.timestamp]
                else:
                    self.schedule = [*self.schedule_events(), (PREEMPTED, ev.timestamp)]
                    self.scheduled = None


live: dict[str, RequestRecord] = {}
"""Internal request id -> record, until its outputs stop."""
fresh: dict[str, RequestRecord] = {}
"""The records of ``live`` still waiting for their first or second token: the only ones every
output is looked up for."""


stoppable: set[str] = set()
"""Only where vLLM's ``_update_stats_from_finished`` cannot be hooked: the requests of ``live``
with stop strings, which their detokenizer may end in a step whose output does not say so (vLLM
then aborts them in EngineCore: ``reqs_to_abort``)."""


def forget(rid: str) -> RequestRecord | None:
    """The record leaves ``live`` (and ``fresh``, ``stoppable``, and vLLM's processor)."""
    fresh.pop(rid, None)
    stoppable.discard(rid)
    rec = live.pop(rid, None)
    if rec is not None:
        if rec.watch is not None:
            rec.unwatch()
        stats = getattr(rec.state, "stats", None)
        if stats is not None:  # it ends other than through ``settle.end`` (aborted, failed)
            rec.events_from_stats(stats)
    return rec


def preemptions(req_state: Any) -> int | None:
    """vLLM's count of the request's preemptions, when it keeps stats."""
    stats = getattr(req_state, "stats", None)
    return stats.num_preemptions if stats is not None else None


def output_tokens(req_state: Any) -> int | None:
    """Output tokens of vLLM's ``RequestState``, counted once at the end rather than per output:
    vLLM's own stats when it keeps them, else its detokenizer's tokens."""
    stats = getattr(req_state, "stats", None)
    if stats is not None:
        return stats.num_generation_tokens
    detokenizer = getattr(req_state, "detokenizer", None)
    return detokenizer.num_output_tokens() if detokenizer is not None else None

settling: dict[str, RequestRecord] = {}
"""Finished in the engine, its final output still on the way to its ``generate`` call: emitted
once the caller took it (finished), or when the caller leaves first (aborted)."""
counted_at_end = False
"""Some request was left to be counted at its end from vLLM's stats (``api._counted_at_end``):
until then the finish hook looks for records alone."""
caller_headers_seen = False
"""Some caller's ``trace_headers`` were noted (``CALLER_HEADERS``): until then the per-request
hooks leave the context variable alone (an untraced server never reads it)."""
caller_headers_due = 0
"""Requests vLLM's server found trace headers on whose ``AsyncLLM.add_request`` has not run
yet (``caller.after_server_trace_headers``): while any is, the caller hook stays on every call."""
caller_headers_due_at = 0.0
"""When the latest of them was found (``time.monotonic``)."""
caller_headers_direct = False
"""Trace headers reached ``AsyncLLM.add_request`` that vLLM's server did not announce: a program
calls it directly, and the caller hook stays on every call."""
CALLER_HEADERS: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_ttft_caller",
                                                                   default=None)
"""The ``trace_headers`` of this task's latest ``AsyncLLM.add_request`` call, as the caller sent
them (vLLM drops them when its own tracing is off; they name the caller's trace)."""
TEXTS: contextvars.ContextVar[dict[int, str] | None] = contextvars.ContextVar(
    "otel_ttft_texts", default=None)
"""Content capture only: the texts of the ``generate`` call whose first step is running."""
