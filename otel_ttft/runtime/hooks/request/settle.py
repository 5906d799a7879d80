"""A request's end in the API process (:meth:`Settler.end`): emitted once its ``generate`` call
took the final output (its first chunk's write is known by then, and a caller that left first is
an abort), on the event loop, ``EMIT_DELAY_S`` after the first of a batch ended; at exit, before
the final flush, whatever still waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from otel_ttft.runtime.hooks.request.state import RequestRecord, Requests
from otel_ttft.runtime.telemetry import bounded_export

EMIT_DELAY_S = 1.0
"""Finished requests are emitted this long after the first of a batch ended: far inside any
export interval (spans leave in batches every 5 s, metrics every 60 s)."""
_SETTLE_RETRY_S = 0.05  # a caller still busy (writing the previous chunk) takes it later
_SETTLE_GIVE_UP_S = 10.0  # then it is emitted as finished (a caller that stopped reading)


class Settler:
    """Holds ended requests (``book.settling``) until their final output is taken; ``emit``
    builds one (``spans.RequestEmitter.emit``); ``on_failure`` applies the failure rule to a
    failure of ours outside any wrapper (the finish hook's ``report_failure``)."""

    def __init__(self, book: Requests, emit: Callable[[RequestRecord, float], None],
                 on_failure: Callable[[BaseException], None]) -> None:
        self.book = book
        self.emit = emit
        self.on_failure = on_failure
        self.loop: asyncio.AbstractEventLoop | None = None  # the one look scheduled, if any
        self.closed = False
        bounded_export.before_exit_flush(self.at_exit)

    def close(self) -> None:
        self.closed = True
        bounded_export.forget_before_exit_flush(self.at_exit)
        self.book.settling.clear()

    def end(self, rec: RequestRecord | None, now: float) -> None:
        """A request vLLM's ``OutputProcessor`` let go: emitted now if nobody takes its outputs
        from a queue (offline ``LLMEngine``), else once its ``generate`` call took the final
        output."""
        if rec is None:
            return
        rec.read_end(now)
        if rec.queue is None:
            self.emit(rec, now)
            return
        self.book.settling[rec.rid] = rec
        self._later(EMIT_DELAY_S)

    def _later(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an output queue outside an event loop: nothing will take it later
            self.settle(give_up=True)
            return
        if self.loop is not loop:
            self.loop = loop
            loop.call_later(delay, self.settle)

    def settle(self, give_up: bool = False) -> None:
        """Emits the finished requests whose final output their ``generate`` call took, as they
        ended (``done``); one never taken is emitted after ``_SETTLE_GIVE_UP_S``."""
        self.loop = None
        if self.closed:
            return
        settling = self.book.settling
        now = time.monotonic()
        try:
            for rid, rec in list(settling.items()):
                taken = rec.taken()
                if taken or give_up or now - (rec.done or now) > _SETTLE_GIVE_UP_S:
                    del settling[rid]
                    self.emit(rec, rec.done if taken else now)
        except Exception as exc:  # noqa: BLE001 - ours, outside any wrapper: the failure rule
            settling.clear()
            self.on_failure(exc)
            return
        if settling:
            self._later(_SETTLE_RETRY_S)

    def at_exit(self) -> None:
        """At exit, before the final flush: requests still waiting to be emitted are emitted."""
        if self.book.settling and not self.closed:
            self.settle(give_up=True)
