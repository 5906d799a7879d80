"""Per-request state in the API process: the record of one engine request, the handle of one
``generate`` call, and which activation a request may have paid for (cold/warm)."""

from __future__ import annotations

import contextvars
import logging
import os
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from otel_ttft import semconv
from otel_ttft.hooks.request import payload
from otel_ttft.hooks.request.timeline import PREEMPTED, SCHEDULED

logger = logging.getLogger("otel_ttft")

_QUEUED, _SCHEDULED, _PREEMPTED = 1, 2, 3  # vllm.v1.engine.EngineCoreEventType values

CAPTURE_CONTENT = os.environ.get(semconv.ENV_CAPTURE_CONTENT, "").strip().lower() == "true"


def _cold_requests() -> int:
    try:
        return max(0, int(os.environ.get(semconv.ENV_COLD_REQUESTS,
                                         semconv.DEFAULT_COLD_REQUESTS)))
    except ValueError:
        return semconv.DEFAULT_COLD_REQUESTS


COLD_REQUESTS = _cold_requests()

live: dict[str, Req] = {}  # internal request id -> record, until its outputs stop
done: list[Req] = []  # finished inside process_outputs; closed once vLLM's own tracing ran
HANDLE: contextvars.ContextVar[Handle | None] = contextvars.ContextVar("otel_ttft_request",
                                                                         default=None)
_failed_once: set[str] = set()


_telemetry = False


def telemetry_on() -> bool:
    """Whether a tracer or meter provider exists yet: without one, tracking would be waste."""
    global _telemetry
    if not _telemetry:
        _telemetry = (not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
                      or hasattr(metrics.get_meter_provider(), "force_flush"))
    return _telemetry


def failed(where: str) -> bool:
    return where in _failed_once


def fail(where: str, exc: BaseException) -> None:
    if where not in _failed_once:
        _failed_once.add(where)
        logger.warning("otel-ttft request hook %s failed: %r", where, exc, exc_info=exc)


class Handle:
    """One ``generate`` call: its parent context and what the HTTP layer was given."""

    __slots__ = ("headers", "context", "model", "streaming", "delta", "records", "first_out",
                 "finish", "texts", "error", "aborted", "flush")

    def __init__(self, headers: Any, context: otel_context.Context | None, model: str | None,
                 streaming: bool, delta: bool = False):
        self.headers, self.context = headers, context  # the caller's traceparent; current span
        self.model, self.streaming = model, streaming
        self.delta = delta
        self.records: list[Req] = []
        self.first_out: float | None = None
        self.finish: list[str] | None = None
        self.texts: dict[int, str] | None = {} if CAPTURE_CONTENT else None
        self.error: str | None = None
        self.aborted = False
        self.flush: FlushBox | None = None  # the HTTP response streaming this request, if any


class FlushBox:
    """When the first body chunk after our first output left for the client (monotonic s)."""

    __slots__ = ("armed", "first")

    def __init__(self) -> None:
        self.armed = False
        self.first: float | None = None


FLUSH: contextvars.ContextVar[FlushBox | None] = contextvars.ContextVar("otel_ttft_flush",
                                                                       default=None)


class Req:
    """One engine request (``n > 1`` makes several per ``generate`` call)."""

    __slots__ = (
        "rid", "ext_id", "handle", "arrival", "model", "params", "prompt_len", "prompt", "lora",
        "trace_headers", "queued", "schedule", "first_tok", "second_tok", "recv", "out_tokens",
        "cached", "engine", "late_preemptions", "finish", "aborted", "error", "done", "vllm",
        "cold", "cold_index", "activation",
    )

    def __init__(self, rid: str, ext_id: str, handle: Handle | None, arrival: float):
        self.rid, self.ext_id, self.handle, self.arrival = rid, ext_id, handle, arrival
        self.model: str | None = None
        self.params: Any = None
        self.prompt_len: int | None = None
        self.prompt: str | None = None
        self.lora: Any = None
        self.trace_headers: Any = None
        self.queued: float | None = None
        self.schedule: list[tuple[str, float]] = []
        self.first_tok: float | None = None
        self.second_tok: float | None = None
        self.recv: float | None = None
        self.out_tokens = 0
        self.cached: int | None = None
        self.engine: dict[str, Any] | None = None
        self.late_preemptions: list[float] = []
        self.finish: str | None = None
        self.aborted = False
        self.error: str | None = None
        self.done: float | None = None
        self.vllm: dict[str, Any] | None = None
        self.cold = False
        self.cold_index = 0
        self.activation: Any = None

    # -- what the first output says (once) -------------------------------------------------------
    def on_first(self, eco: Any, ts: float, now: float) -> None:
        self.recv = now
        if eco.new_token_ids or getattr(eco, "pooling_output", None) is not None:
            self.first_tok = ts
        self.out_tokens += len(eco.new_token_ids)
        if eco.events:
            self.on_events(eco.events)
        headers = eco.trace_headers
        if headers and semconv.ENGINE_PAYLOAD_HEADER in headers:
            rest = {k: v for k, v in headers.items() if k != semconv.ENGINE_PAYLOAD_HEADER}
            eco.trace_headers = rest or None
            self.engine = payload.decode(headers[semconv.ENGINE_PAYLOAD_HEADER])
        stats = getattr(eco, "prefill_stats", None)
        if stats is not None:
            self.cached = stats.num_cached_tokens
        if eco.finish_reason is not None:
            self.finish = str(eco.finish_reason)

    def on_events(self, events: Any) -> None:
        for ev in events:
            kind = int(ev.type)
            if kind == _QUEUED:
                if self.queued is None:
                    self.queued = ev.timestamp
            elif kind == _SCHEDULED:
                self.schedule.append((SCHEDULED, ev.timestamp))
            elif kind == _PREEMPTED:
                if self.first_tok is not None and ev.timestamp >= self.first_tok:
                    self.late_preemptions.append(ev.timestamp)
                else:
                    self.schedule.append((PREEMPTED, ev.timestamp))


# --- activation bookkeeping ----------------------------------------------------------------------

_act_key: Any = None
_act_count = 0


def note_activation(rec: Req) -> None:
    global _act_key, _act_count
    try:
        from otel_ttft.hooks.activation import last_activation
    except ImportError:
        return
    act = last_activation()
    if act is None:
        return
    key = (act.kind, act.start_ns)
    if key != _act_key:
        _act_key, _act_count = key, 0
    _act_count += 1
    rec.activation = act
    rec.cold_index = _act_count
    rec.cold = _act_count <= COLD_REQUESTS


