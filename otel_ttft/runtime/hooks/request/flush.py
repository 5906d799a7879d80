"""When the chunk carrying a request's first token left the API server: starlette's
``StreamingResponse.stream_response`` writes through a ``send`` of ours that timestamps the
first body chunk after the request's first output."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any


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


def _timed(send: Callable[[Any], Awaitable[None]], box: FirstChunk) -> Callable[[Any], Any]:
    async def timed_send(message: Any) -> None:
        await send(message)
        if box.armed and box.first is None and message.get("type") == "http.response.body":
            box.first = time.monotonic()

    return timed_send


def wrap_stream_response(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """starlette's own ``stream_response``, with our ``send``; the box goes into the context of
    the task that runs the response, where ``generate`` finds it."""
    box = FirstChunk()
    FLUSH.set(box)
    if args:
        return call(_timed(args[0], box), *args[1:], **kwargs)
    return call(*args, **{**kwargs, "send": _timed(kwargs["send"], box)})
