"""A request's end in the API process: vLLM's ``OutputProcessor`` let go of it (``end``). It is
emitted once its ``generate`` call took the final output (its first chunk's write is known by
then, and a caller that left first is seen as an abort), on the event loop, ``EMIT_DELAY_S``
after the first of a batch ended."""

from __future__ import annotations

import asyncio
import time

from otel_ttft.runtime.hooks import registry
from otel_ttft.runtime.hooks.request import spans as request_spans
from otel_ttft.runtime.hooks.request.state import RequestRecord, book
from otel_ttft.runtime.telemetry import bounded_export

EMIT_DELAY_S = 1.0
"""Finished requests are emitted this long after the first of a batch ended: far inside any
export interval (spans leave in batches every 5 s, metrics every 60 s)."""
_SETTLE_RETRY_S = 0.05  # a caller still busy (writing the previous chunk) takes it later
_SETTLE_GIVE_UP_S = 10.0  # then it is emitted as finished (a caller that stopped reading)


class _Schedule:
    """The event loop one look at ``book.settling`` is scheduled on, if any."""

    loop: asyncio.AbstractEventLoop | None = None


def end(rec: RequestRecord | None, now: float) -> None:
    """A request vLLM's ``OutputProcessor`` let go: emitted now if nobody takes its outputs from
    a queue (offline ``LLMEngine``), else once its ``generate`` call took the final output."""
    if rec is None:
        return
    rec.read_end(now)
    if rec.queue is None:
        request_spans.emit_request(rec, now)
        return
    book.settling[rec.rid] = rec
    _later(EMIT_DELAY_S)


def _later(delay: float) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # an output queue outside an event loop: nothing will take it later
        settle(give_up=True)
        return
    if _Schedule.loop is not loop:
        _Schedule.loop = loop
        loop.call_later(delay, settle)


def settle(give_up: bool = False) -> None:
    """Emits the finished requests whose final output their ``generate`` call took, as they
    ended (``done``); one never taken is emitted after ``_SETTLE_GIVE_UP_S``."""
    _Schedule.loop = None
    now = time.monotonic()
    try:
        for rid, rec in list(book.settling.items()):
            taken = rec.taken()
            if taken or give_up or now - (rec.done or now) > _SETTLE_GIVE_UP_S:
                del book.settling[rid]
                request_spans.emit_request(rec, rec.done if taken else now)
    except Exception as exc:  # noqa: BLE001 - ours, outside any wrapper: the failure rule
        book.settling.clear()
        hook = registry.applied.get("request.finish")
        if hook is not None:
            registry.report_failure(hook, exc)
        return
    if book.settling:
        _later(_SETTLE_RETRY_S)


def _settle_at_exit() -> None:
    """At exit, before the final flush: requests still waiting to be emitted are emitted."""
    if book.settling:
        settle(give_up=True)


bounded_export.before_flush(_settle_at_exit)
