"""When the chunk carrying a request's first token left: the ``request.flush`` hook on starlette's
real ``StreamingResponse``."""

from __future__ import annotations

import asyncio
import time

from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import PASS, HookSet
from otel_ttft.runtime.hooks.request import flush, state


def test_the_first_chunk_after_the_first_output_is_timed_and_later_ones_pass_straight_through(
        monkeypatch):
    from starlette.responses import StreamingResponse

    looks: list[str] = []
    timed_call = flush._TimedSend.__call__

    def counted(self, message):
        looks.append(message.get("body", message["type"]))
        return timed_call(self, message)

    monkeypatch.setattr(flush._TimedSend, "__call__", counted)
    boxes: list[flush.ResponseSend] = []
    sent: list[tuple[bytes | None, float]] = []

    async def body():
        yield b"role"  # written before any output: not the first token's chunk
        box = flush.FLUSH.get()
        boxes.append(box)
        assert box.first is None
        box.arm()  # what the request's first output does (``RequestRecord.on_first``)
        yield b"first"
        yield b"second"
        yield b"third"

    async def send(message):
        await asyncio.sleep(0.01)  # the server writing it
        sent.append((message.get("body"), time.monotonic()))

    async def receive():
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    hooks = HookSet([h for h in request.HOOKS if h.name == "request.flush"])
    hooks.apply()
    try:
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "GET"}
        asyncio.run(StreamingResponse(body())(scope, receive, send))
    finally:
        hooks.remove()

    assert [b for b, _ in sent] == [None, b"role", b"first", b"second", b"third", b""]
    (box,) = boxes
    written = dict(sent)
    assert written[b"first"] <= box.first < written[b"second"]  # once the server wrote it
    # Ours looked at the first token's chunk alone; vLLM's send took the rest, the start and the
    # chunk written before the first output included.
    assert looks == [b"first"]
    assert type(box) is flush.ResponseSend  # plain again after it


def test_an_armed_send_passes_anything_but_a_body_chunk_on_and_stays_armed():
    """A message other than a body chunk after the first output (none in starlette today) is
    not the first token's chunk."""
    seen = []

    async def send(message):
        seen.append(message["type"])

    async def run():
        timed = flush.ResponseSend(send)
        timed.first = None
        timed.arm()
        await timed({"type": "http.response.trailers"})
        assert timed.first is None and type(timed) is not flush.ResponseSend
        await timed({"type": "http.response.body", "body": b"x"})
        return timed

    timed = asyncio.run(run())
    assert seen == ["http.response.trailers", "http.response.body"]
    assert timed.first is not None and type(timed) is flush.ResponseSend


def test_the_callers_trace_headers_are_noted_only_when_there_are_some():
    """``AsyncLLM.add_request``'s hook: an untraced request sets nothing in its task's context
    (a context variable set is a new context mapping the task keeps); a later call in the same
    task without headers does not inherit the earlier one's."""
    import contextvars

    from otel_ttft.runtime.hooks.request import api

    def add(**kwargs):
        assert api.before_engine_add_request(None, (), kwargs) is PASS  # vLLM's call unchanged
        return state.CALLER_HEADERS.get()

    def run():
        seen = [add(trace_headers=None)]
        untouched = contextvars.copy_context()
        seen.append(add(trace_headers={"t": "1"}))
        seen.append(add(trace_headers=None))
        return seen, untouched

    seen, untouched = contextvars.Context().run(run)  # nothing set before
    assert seen == [None, {"t": "1"}, None]
    assert state.CALLER_HEADERS not in untouched  # the untraced call set nothing
