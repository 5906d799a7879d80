"""When the chunk carrying a request's first token left: the ``request.flush`` hook on starlette's
real ``StreamingResponse``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import HookSet
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


class _Engine:
    """Stands in for ``AsyncLLM``: its ``add_request`` (vLLM's signature) says what the
    ``request.caller`` hook, which runs ahead of it, left in the task's context."""

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None,
                    tokenization_kwargs=None, trace_headers=None):
        return state.CALLER_HEADERS.get()


def _caller_hooks(serving_module):
    """``request.caller`` on ``_Engine`` and, given vLLM's server module, ``request.caller_server``
    on vLLM's real ``extract_trace_headers``."""
    import sys

    engine_hooks = HookSet([replace(h, target=f"{__name__}:_Engine.add_request", applied=False)
                            for h in request.HOOKS if h.name == "request.caller"])
    engine_hooks.apply_to(sys.modules[__name__])
    server_hooks = HookSet([replace(h, applied=False) for h in request.HOOKS
                            if h.name == "request.caller_server"])
    if serving_module is not None:
        server_hooks.apply_to(serving_module)

    def remove():
        engine_hooks.remove(sys.modules[__name__])
        if serving_module is not None:
            server_hooks.remove(serving_module)
    return remove


def _fresh_caller_state(monkeypatch):
    for name, value in (("caller_headers_seen", False), ("caller_headers_due", 0),
                        ("caller_headers_due_at", 0.0), ("caller_headers_direct", False)):
        monkeypatch.setattr(state, name, value)


def test_vllms_server_calls_its_own_add_request_while_no_traced_request_is_on_its_way(
        monkeypatch):
    """In vLLM's server, an untraced ``AsyncLLM`` runs vLLM's own ``add_request`` (the caller
    hook cost every request about 4 us); a request with a ``traceparent`` (vLLM's real
    ``BaseServing._get_trace_headers`` calls ``extract_trace_headers`` only then) brings the hook
    back ahead of its ``add_request``; the next untraced call neither inherits its headers nor
    keeps the hook on."""
    import contextvars

    import pytest

    serving = pytest.importorskip("vllm.entrypoints.serve.engine.serving")
    _fresh_caller_state(monkeypatch)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    remove = _caller_hooks(serving)
    engine = _Engine()

    async def handle(headers):
        found = await serving.BaseServing._get_trace_headers(None, headers)
        return engine.add_request("r", "p", None, trace_headers=found)

    def run():
        seen = [asyncio.run(handle({"accept": "text/event-stream"}))]
        hooked = ["add_request" not in vars(engine)]
        untouched = contextvars.copy_context()
        seen.append(asyncio.run(handle({"accept": "*/*"})))
        seen.append(asyncio.run(handle({"traceparent": traceparent})))
        hooked.append("add_request" not in vars(engine))
        seen.append(engine.add_request("r", "p", None, trace_headers=None))
        hooked.append("add_request" not in vars(engine))
        return seen, hooked, untouched

    try:
        seen, hooked, untouched = contextvars.Context().run(run)
    finally:
        remove()
    assert seen == [None, None, {"traceparent": traceparent}, None]
    assert hooked == [False, True, False]
    assert state.caller_headers_due == 0 and not state.caller_headers_direct
    assert state.CALLER_HEADERS not in untouched  # the untraced calls set nothing


def test_a_traced_request_that_never_reaches_the_engine_is_forgotten(monkeypatch):
    """A traced request the server refuses after reading its headers never calls
    ``add_request``: the hook stays on only until the count gives it up."""
    import pytest

    from otel_ttft.runtime.hooks.request import caller

    serving = pytest.importorskip("vllm.entrypoints.serve.engine.serving")
    _fresh_caller_state(monkeypatch)
    remove = _caller_hooks(serving)
    engine = _Engine()
    try:
        serving.extract_trace_headers({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        engine.add_request("r", "p", None)
        waiting = "add_request" not in vars(engine)
        state.caller_headers_due_at -= caller.CALLER_HEADERS_DUE_S
        engine.add_request("r", "p", None)
        given_up = "add_request" in vars(engine)
    finally:
        remove()
    assert waiting and given_up and state.caller_headers_due == 0


def test_an_embedding_program_keeps_the_caller_hook_on_every_call(monkeypatch):
    """Without vLLM's server (``AsyncLLM`` called by a program of its own), nothing says when
    a request carries trace headers: the hook stays on every call; so it does once headers
    arrive that the server did not announce (a program beside the imported server)."""
    import pytest

    _fresh_caller_state(monkeypatch)
    remove = _caller_hooks(None)
    engine = _Engine()
    try:
        first = engine.add_request("r", "p", None, trace_headers=None)
        assert "add_request" not in vars(engine)
        later = engine.add_request("r", "p", None, trace_headers={"traceparent": "x"})
    finally:
        remove()
    assert first is None and later == {"traceparent": "x"}

    serving = pytest.importorskip("vllm.entrypoints.serve.engine.serving")
    _fresh_caller_state(monkeypatch)
    remove = _caller_hooks(serving)
    engine = _Engine()
    try:
        direct = engine.add_request("r", "p", None, trace_headers={"traceparent": "y"})
        engine.add_request("r", "p", None)
        again = engine.add_request("r", "p", None, trace_headers={"traceparent": "z"})
    finally:
        remove()
    assert direct == {"traceparent": "y"} and again == {"traceparent": "z"}
    assert state.caller_headers_direct
