"""When the chunk carrying a request's first token left: the ``request.flush`` hook on starlette's
real ``StreamingResponse``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.hooks.request import api, state


def test_the_first_chunk_after_the_first_output_is_timed():
    from starlette.responses import StreamingResponse

    boxes: list[state.FirstChunk] = []
    sent: list[tuple[bytes | None, float]] = []

    async def body():
        yield b"role"  # written before any output: not the first token's chunk
        box = state.FLUSH.get()
        boxes.append(box)
        assert box.first is None
        box.armed = True  # what the request's first output does (``api.wrap_process_outputs``)
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


def test_an_armed_send_passes_anything_but_a_body_chunk_on_and_stays_armed():
    """A message other than a body chunk after the first output (none in starlette today) is
    not the first token's chunk."""
    seen = []

    async def send(message):
        seen.append(message["type"])

    async def run():
        box = state.FirstChunk()
        timed = api._timed(send, box)
        box.armed = True
        await timed({"type": "http.response.trailers"})
        assert box.first is None
        await timed({"type": "http.response.body", "body": b"x"})
        return box

    box = asyncio.run(run())
    assert seen == ["http.response.trailers", "http.response.body"]
    assert box.first is not None


class _Engine:
    """Stands in for ``AsyncLLM``: its ``add_request`` (vLLM's signature) says what the
    ``request.caller`` hook, which runs ahead of it, left in the task's context."""

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None,
                    tokenization_kwargs=None, trace_headers=None):
        return state.CALLER_HEADERS.get()


def test_the_caller_hook_notes_each_calls_trace_headers_in_its_task():
    """``request.caller`` runs ahead of ``AsyncLLM.add_request`` and leaves the call's
    ``trace_headers`` (or none) in the task's context, where ``OutputProcessor.add_request``
    reads them."""
    import sys

    hooks = HookSet([replace(h, target=f"{__name__}:_Engine.add_request", applied=False)
                     for h in request.HOOKS if h.name == "request.caller"])
    hooks.apply_to(sys.modules[__name__])
    try:
        engine = _Engine()
        traced = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        assert engine.add_request("a", "p", None, trace_headers=traced) == traced
        assert engine.add_request("b", "p", None) is None  # an untraced call after it
        assert engine.add_request("c", "p", None, None, None, None, traced) == traced
    finally:
        hooks.remove(sys.modules[__name__])
