"""When the chunk carrying a request's first token left the API server: starlette's
``StreamingResponse.stream_response`` gets a ``send`` that timestamps that one chunk."""

from __future__ import annotations

import functools
import time
from typing import Any

from otel_ttft.runtime.hooks.registry import Swap
from otel_ttft.runtime.hooks.request.state import FLUSH, FlushBox


class _Send(functools.partial):
    """starlette's ASGI ``send`` of one streaming response (``func``), called from C: a
    ``partial`` adds no Python frame to a chunk."""

    __slots__ = ("box",)


class _TimedSend(_Send):
    """The same ``send`` until the first body chunk after the request's first output: that one
    is awaited here and timestamped once the server has written it, and the object becomes a
    plain ``_Send`` for every later chunk (a Python ``__call__`` per chunk cost the server about
    1 us a chunk with its caches cold)."""

    __slots__ = ()

    def __call__(self, message: Any) -> Any:
        if self.box.armed and message.get("type") == "http.response.body":
            first = self._first(message)
            self.__class__ = _Send
            return first
        return self.func(message)

    async def _first(self, message: Any) -> None:
        await self.func(message)
        self.box.first = time.monotonic()


def timed_send(instance: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """starlette's own ``stream_response`` is called with our ``send`` (no wrapper around the
    coroutine: an ``async`` one would sit, three coroutine frames deep, around every response
    for its whole life, and measured end to end that cost the API process about 1.6 ms of CPU
    per streamed request, more than all our other hooks together). The box goes into the
    context of the task that runs the response (starlette gives it a task of its own), where
    ``generate`` finds it."""
    timed = _TimedSend(args[0] if args else kwargs["send"])
    timed.box = box = FlushBox()
    FLUSH.set(box)
    if args:
        return (timed, *args[1:]), kwargs
    return args, {**kwargs, "send": timed}


wrap_stream_response = Swap(timed_send)
