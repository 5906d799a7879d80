"""When the chunk carrying a request's first token left the API server: starlette's
``StreamingResponse.stream_response`` gets a ``send`` that timestamps that one chunk."""

from __future__ import annotations

import contextvars
import functools
import time
from typing import Any

from otel_ttft.runtime.hooks.registry import Swap


class ResponseSend(functools.partial):
    """starlette's ASGI ``send`` of one streaming response (``func``), called from C: a
    ``partial`` adds no Python frame to a chunk. It is also the request's box (``FLUSH``,
    ``RequestRecord.flush``): ``first`` is when the server finished writing the chunk after the
    request's first output (``None`` until then). ``arm`` times the next body chunk: the object
    becomes an ``ARMED`` send for that one chunk and a plain ``ResponseSend`` again after it (a
    Python ``__call__`` per chunk cost the server about 1 us a chunk with its caches cold, and
    one before the first output, for the response's start, cost one frame a request)."""

    __slots__ = ("first",)

    def arm(self) -> None:
        """The request's first output reached the API process: its chunk is next."""
        self.__class__ = ARMED


class _TimedSend(ResponseSend):
    """The armed ``send``: the next message is awaited here (one coroutine, no other frame) and,
    if it is the first body chunk, timestamped once the server has written it."""

    __slots__ = ()

    async def __call__(self, message: Any) -> None:
        await self.func(message)
        if message.get("type") == "http.response.body":
            self.first = time.monotonic()
            self.__class__ = ResponseSend


ARMED = _TimedSend
"""The class an armed ``ResponseSend`` takes (``arm``; the record's first output sets it
directly, a frame less per request)."""


FLUSH: contextvars.ContextVar[ResponseSend | None] = contextvars.ContextVar("otel_ttft_flush",
                                                                           default=None)
"""The ``send`` of the streaming HTTP response this task writes, if any (read by
``add_request``, which runs in the response's task)."""


def timed_send(instance: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """starlette's own ``stream_response`` is called with our ``send`` (no wrapper around the
    coroutine: an ``async`` one would sit, three coroutine frames deep, around every response
    for its whole life, and measured end to end that cost the API process about 1.6 ms of CPU
    per streamed request, more than all our other hooks together). The ``send`` goes into the
    context of the task that runs the response, where ``generate`` finds it."""
    send = ResponseSend(args[0] if args else kwargs["send"])
    send.first = None
    FLUSH.set(send)
    if args:
        return (send, *args[1:]), kwargs
    return args, {**kwargs, "send": send}


wrap_stream_response = Swap(timed_send)
