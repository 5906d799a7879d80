"""A request's end in the API process and the batched emission: vLLM's ``OutputProcessor`` let
go of it (``end``); it is emitted once its ``generate`` call took the final output, with the
other requests that ended within ``EMIT_DELAY_S`` (``_settle``), where our code runs warm."""

from __future__ import annotations

import asyncio
import time
from asyncio import _get_running_loop
from typing import Any

from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.hooks import activation
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.runtime.hooks.request import detail as request_detail
from otel_ttft.runtime.hooks.request import first_use
from otel_ttft.runtime.hooks.request import metrics as request_metrics
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request.attributes import operation_name
from otel_ttft.runtime.hooks.request.state import (
    RequestRecord,
    fresh,
    live,
    output_tokens,
    preemptions,
    settling,
    stoppable,
)
from otel_ttft.runtime.hooks.request.timeline import SCHEDULED, stage_durations
from otel_ttft.runtime.telemetry import bounded_export

failures: Hook | None = None
"""The hook a failure of the batched emission (outside any wrapper) is reported on: the
per-step output hook, set by ``api`` where it is defined."""


def end(records: list[RequestRecord], now: float) -> None:
    """Requests vLLM's ``OutputProcessor`` let go: emitted now, or once their ``generate`` call
    took the final output (``settling``), in a batch ``EMIT_DELAY_S`` on. Once per request, in
    vLLM's busy step: ``state.forget`` and the looks below are inline (each frame of ours costs
    the server a few microseconds there, its caches cold)."""
    if len(_untaken) >= _UNTAKEN_LOOK:
        _let_go_of_taken_queues()
    for rec in records:
        rid = rec.rid
        if fresh:  # ``state.forget``; both are empty on the usual path
            fresh.pop(rid, None)
        if stoppable:
            stoppable.discard(rid)
        live.pop(rid, None)
        if rec.watch is not None:
            rec.unwatch()
        rec.done = now
        req_state = rec.state
        stats = getattr(req_state, "stats", None)
        if stats is not None:  # vLLM keeps stats (the API server's default): its counts
            rec.out_tokens = stats.num_generation_tokens or rec.out_tokens
            rec.preemptions = stats.num_preemptions
            if rec.queued is None and rec.schedule is None and rec.scheduled is None:
                # ``RequestRecord.events_from_stats``, in line (once per request, in the step)
                rec.queued = stats.queued_ts or None
                rec.scheduled = stats.scheduled_ts or None
        else:
            rec.out_tokens = output_tokens(req_state) or rec.out_tokens
            rec.preemptions = preemptions(req_state)
        rec.state = None  # vLLM's request state (its detokenizer) is not kept while it waits
        if rec.queue is None:  # nobody takes its outputs from a queue: emitted at once
            request_spans.emit_request(rec, now)
        else:
            # Nothing it waits with keeps alive what would die now: every such object outlives
            # a young collection and brings the API server's next one closer (measured: with
            # the record keeping them, 8 times the young collections per request at c4). Its
            # sampling parameters are already the values its span may carry (``add``).
            flush = rec.flush
            if flush is not None and flush.first is not None:
                rec.flushed, rec.flush = flush.first, None
            settling[rid] = rec
            _untaken.append(rec)
    if settling:
        loop = _get_running_loop()  # C, None outside a loop: ``_settle_later`` without its frame
        if loop is None or _settle_scheduled.get(EMIT_DELAY_S) is not loop:
            _settle_later(EMIT_DELAY_S)


counted: list[tuple] = []
"""Requests that ended without a record (``api._counted_at_end``), as the few values of vLLM's
``RequestState`` and ``RequestStateStats`` their metrics need (``end_from_stats``), until the
next batch (``_emit_counted``). Values, not vLLM's objects: nothing the request held outlives
it."""


def end_from_stats(req_state: Any, finish: Any, now: float) -> None:
    """A request that got no record ended: what vLLM kept of it is noted (``counted``) and
    emitted with the next batch. In vLLM's busy step: a tuple, no record, no frame more."""
    stats = req_state.stats
    if stats is None:
        return
    counted.append((stats.arrival_time, stats.queued_ts, stats.scheduled_ts,
                    stats.first_token_ts, stats.first_token_latency,
                    stats.num_generation_tokens, stats.num_preemptions, finish, now,
                    req_state.request_id, req_state.external_req_id, req_state.prompt_len,
                    req_state.num_cached_tokens, req_state.lora_request))
    loop = _get_running_loop()  # C, None outside a loop: ``_settle_later`` without its frame
    if loop is None or _settle_scheduled.get(EMIT_DELAY_S) is not loop:
        _settle_later(EMIT_DELAY_S)


def record_from_stats(req_state: Any, finish: Any, now: float) -> RequestRecord | None:
    """The record of a request that got none, made from vLLM's ``RequestState`` and its
    ``RequestStateStats`` (the times vLLM keeps for its own metrics: arrival, QUEUED, first
    SCHEDULED, the first token's step and when the API process got it); ``None`` without
    stats. Its TTFT ends when the API process got the first token (vLLM's
    ``first_token_latency``), as vLLM's own TTFT does."""
    stats = req_state.stats
    if stats is None:
        return None
    return _record(stats.arrival_time, stats.queued_ts, stats.scheduled_ts,
                   stats.first_token_ts, stats.first_token_latency,
                   stats.num_generation_tokens, stats.num_preemptions, finish, now,
                   req_state.request_id, req_state.external_req_id, req_state.prompt_len,
                   req_state.num_cached_tokens, req_state.lora_request,
                   offset=now - time.time())


def _record(arrival_wall: float, queued: float, scheduled: float, first_tok: float,
            first_latency: float, out_tokens: int, preemptions: int, finish: Any, done: float,
            rid: str, ext_id: str | None, prompt_len: int | None, cached: int | None, lora: Any,
            *, offset: float) -> RequestRecord:
    """A record from what ``end_from_stats`` noted; ``offset``: monotonic minus wall clock."""
    arrival = arrival_wall + offset
    rec = RequestRecord(rid, ext_id or rid, arrival, taken=True, from_stats=True, done=done,
                        finish=finish, queued=queued or None, scheduled=scheduled or None,
                        out_tokens=out_tokens, preemptions=preemptions, prompt_len=prompt_len,
                        cached=cached, activation=activation.latest)
    if first_tok:
        rec.first_tok = first_tok
        rec.recv = arrival + first_latency
    if lora is not None:
        rec.lora, rec.model = lora, lora.lora_name
    else:
        rec.model = this_process.served_model
    return rec


def _emit_counted(noted: tuple, offset: float) -> None:
    """One request counted at its end (``counted``): its TTFT sample and stage times straight
    from vLLM's times; a record and ``emit_request`` only where it gets a span (slow, in the
    tail, no first token, or it waited for a front-end cache to fill)."""
    (arrival_wall, queued, scheduled, first_tok, first_latency, _, _, _, _, _, ext_id, _, _,
     lora) = noted
    arrival = arrival_wall + offset
    detail = request_spans.ASK
    if first_tok and not first_use.within(arrival, queued or first_tok):
        model = lora.lora_name if lora is not None else this_process.served_model
        recv = arrival + first_latency
        stages = stage_durations(arrival, queued or None,
                                 [(SCHEDULED, scheduled)] if scheduled else [], first_tok, recv)
        detail = request_detail.reason(cold=False, ttft=first_latency, failed=False,
                                       model=model)
        if not request_detail.wants_span(detail, traced=False):
            request_metrics.record_request(first_latency, stages, model, False, None, None,
                                           context=request_metrics.NO_SPAN,
                                           operation=operation_name(ext_id or noted[9]))
            return
    rec = _record(*noted, offset=offset)
    request_spans.emit_request(rec, rec.done, detail=detail)


EMIT_DELAY_S = 1.0
"""Finished requests are emitted in batches, this long after the first of a batch ended. One
request's emission touches some thirty functions of ours and the SDK's; in a busy API server
each runs with its caches cold (vLLM, the HTTP stack and the event loop ran in between, and the
worker's matrix work on the next core sweeps the shared cache), about twenty times slower than
the same code run back to back: measured in the server, emitting requests one by one cost more
than all our per-step work. In a batch, the second request on runs warm. A second is far
inside any export interval (spans leave in batches every 5 s, metrics every 60 s)."""
_EMIT_BATCH = 256  # requests emitted per event-loop callback: the loop is not held for long
_SETTLE_RETRY_S = 0.05  # a caller still busy (writing the previous chunk) takes it later
_SETTLE_GIVE_UP_S = 10.0  # then it is emitted as finished (a caller that stopped reading)
_UNTAKEN_LOOK = 8  # ``_untaken`` is looked at once it holds this many (not at every end)
_settle_scheduled: dict[float, Any] = {}  # delay -> the event loop a look is scheduled on
_untaken: list[RequestRecord] = []
"""Records of ``settling`` whose final output was not yet seen taken: looked at when the next
requests end, and once taken their queue (vLLM's collector, its event and the event's deque) is
let go instead of living on to the emission."""


def _let_go_of_taken_queues() -> None:
    waiting = []
    for rec in _untaken:
        if settling.get(rec.rid) is not rec:  # emitted or aborted meanwhile
            continue
        if rec.queue.output is None:
            rec.taken, rec.queue = True, None
        else:
            waiting.append(rec)
    _untaken[:] = waiting


def _settle_later(delay: float) -> None:
    """One look at ``settling`` on this event loop, ``delay`` seconds on (0: right after the
    callbacks queued so far)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # an output queue outside an event loop: nothing will take it later
        _settle(give_up=True)
        return
    if _settle_scheduled.get(delay) is loop:
        return
    _settle_scheduled[delay] = loop
    if delay:
        loop.call_later(delay, _settle, False, delay)
    else:
        loop.call_soon(_settle, False, delay)


def _settle(give_up: bool = False, delay: float | None = None) -> None:
    """Emits the finished requests whose final output their ``generate`` call took, as they
    ended (``done``). A caller that leaves first is seen by ``wrap_abort_requests`` (vLLM
    aborts on the way out); one that never takes it is emitted at ``_SETTLE_GIVE_UP_S``."""
    _settle_scheduled.pop(delay, None)
    now = time.monotonic()
    more = False
    try:
        emitted = 0
        if counted:
            offset = now - time.time()
            batch = counted[:] if give_up else counted[:_EMIT_BATCH]
            del counted[:len(batch)]
            for noted in batch:
                _emit_counted(noted, offset)
            emitted = len(batch)
        for rid, rec in list(settling.items()):
            if emitted == _EMIT_BATCH and not give_up:
                more = True  # the rest right after the callbacks queued meanwhile
                break
            taken = rec.taken or rec.queue.output is None
            if taken or give_up or now - rec.done > _SETTLE_GIVE_UP_S:
                del settling[rid]
                request_spans.emit_request(rec, rec.done if taken else now)
                emitted += 1
    except Exception as exc:  # noqa: BLE001 - ours, outside any wrapper: the hooks' failure rule
        settling.clear()
        counted.clear()
        _untaken.clear()
        if failures is not None:
            report_failure(failures, exc)
        return
    if more or counted:
        _settle_later(0.0)
    elif settling:
        _settle_later(_SETTLE_RETRY_S)
    else:
        _untaken.clear()


def _settle_at_exit() -> None:
    """At exit, before the final flush: requests still waiting to be emitted are emitted."""
    if settling or counted:
        _settle(give_up=True)


bounded_export.before_flush(_settle_at_exit)
