"""How a request ends, on vLLM's real ``AsyncLLM.generate`` and ``OutputProcessor``.

The concurrent-streams test dropped a request after its first chunk and sometimes found it not
marked aborted (2 of 26 runs). The cause: when the engine finished the request before the server
saw the client leave, the final output was still waiting in the request's output collector, the
record already had the engine's finish reason, and ``ttft.request.aborted`` was only set for
requests without one. The caller never got that final output: the request was aborted. These
tests drive that order of events (and its neighbours) step by step; only the engine core client
and ``AsyncLLM.add_request``'s input processing are stood in for.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks import request
from tests.request_engine import Engine, params, request_span

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


async def _first_output(engine: Engine, rid: str, max_tokens: int = 8):
    agen = engine.llm.generate("hello", params(max_tokens), rid)
    first = asyncio.ensure_future(agen.__anext__())
    await asyncio.sleep(0)  # generate's first step: add_request, then it waits for output
    engine.step(rid, 21, first=True)
    out = await first
    assert out.outputs[0].token_ids == [21]
    return agen


def test_client_leaves_after_the_engine_finished_but_before_the_final_output(engine, api_telemetry):
    """The flake's order of events: aborted, although the engine's finish reason is known."""
    exporter, _ = api_telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-late-1", max_tokens=3)
        engine.step("cmpl-late-1", 22)
        engine.step("cmpl-late-1", 23, finish=True)  # finished in the engine: output queued
        await agen.aclose()  # the client left before reading it

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs.get(semconv.ATTR_REQUEST_ABORTED) is True
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)  # what the engine did
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3


def test_client_cancelled_while_waiting_for_the_next_output(engine, api_telemetry):
    """A disconnect cancels the task awaiting the next output: vLLM aborts; so do we."""
    exporter, _ = api_telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-cancel-1", max_tokens=200)
        waiting = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())
    assert engine.llm.engine_core.aborted == ["cmpl-cancel-1"]
    attrs = request_span(exporter).attributes
    assert attrs.get(semconv.ATTR_REQUEST_ABORTED) is True
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1


def test_final_output_read_then_the_client_leaves_is_not_aborted(engine, api_telemetry):
    exporter, reader = api_telemetry

    async def scenario():
        agen = await _first_output(engine, "chatcmpl-done-1", max_tokens=2)
        engine.step("chatcmpl-done-1", 22, finish=True)
        last = await agen.__anext__()
        assert last.finished
        await agen.aclose()

    asyncio.run(scenario())
    span = request_span(exporter)
    attrs = span.attributes
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[semconv.GEN_AI_PROVIDER_NAME] == "vllm"
    # The TTFT sample carries the GenAI attributes and an exemplar pointing at this trace.
    points = [p for m in _metrics(reader) if m.name == semconv.METRIC_SERVER_TTFT
              for p in m.data.data_points]
    (point,) = points
    assert point.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert point.attributes[semconv.GEN_AI_PROVIDER_NAME] == "vllm"
    assert {e.trace_id for e in point.exemplars} == {span.context.trace_id}


def _metrics(reader):
    data = reader.get_metrics_data()
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def test_stream_read_to_its_end_is_emitted_once_the_caller_took_the_final_output(
        engine, api_telemetry, request_parts):
    """No wrapper around ``generate``: the record waits until its final output left the queue."""
    api = request_parts["request.api"]
    exporter, _ = api_telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-end-1", max_tokens=2)
        engine.step("cmpl-end-1", 22, finish=True)
        assert "cmpl-end-1" in api.book.settling  # finished, output not yet taken
        await asyncio.sleep(0)  # the loop runs our look: the output is still in the queue
        assert not [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
        rest = [out async for out in agen]
        assert [o.finished for o in rest] == [True]
        await asyncio.sleep(0.2)  # the retry look finds the queue empty
        assert not api.book.settling

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.ATTR_REQUEST_STREAMING] is True
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


def test_finished_requests_are_emitted_in_one_batch_each_span_ending_when_its_request_did(
        engine, api_telemetry, request_parts, monkeypatch):
    """In a busy server one request's emission runs with cold caches (about twenty times the
    same code run back to back): finished requests wait ``EMIT_DELAY_S`` and go out together,
    each span still ending when its request ended, not when it was emitted."""
    api = request_parts["request.api"]
    exporter, _ = api_telemetry
    monkeypatch.setattr(request.settle, "EMIT_DELAY_S", 0.3)
    looks: list[list[str]] = []
    settle = api.settler.settle

    def look(*args):
        looks.append(sorted(api.book.settling))
        settle(*args)

    monkeypatch.setattr(api.settler, "settle", look)
    ended: dict[str, int] = {}

    def spans():
        return {s.attributes[semconv.VLLM_REQUEST_ID]: s for s in exporter.get_finished_spans()
                if s.name == semconv.SPAN_REQUEST}

    async def scenario():
        for rid in ("cmpl-batch-1", "cmpl-batch-2"):
            agen = await _first_output(engine, rid, max_tokens=2)
            engine.step(rid, 22, finish=True)
            ended[rid] = clock.now_ns()
            assert [o.finished for o in [out async for out in agen]] == [True]
            await asyncio.sleep(0.05)
        assert not spans()  # both finished and taken by their callers; none emitted yet
        await asyncio.sleep(0.4)
        assert not api.book.settling

    asyncio.run(scenario())
    assert looks == [["cmpl-batch-1", "cmpl-batch-2"]]  # one look emitted both
    emitted = spans()
    assert set(emitted) == set(ended)
    for rid, span in emitted.items():
        assert span.end_time <= ended[rid]  # the request's end, not the emission's
        assert ended[rid] - span.end_time < 50_000_000
        assert semconv.ATTR_REQUEST_ABORTED not in span.attributes


def test_caller_that_stops_reading_is_emitted_as_finished_after_the_give_up(engine, api_telemetry,
                                                                            request_parts,
                                                                             monkeypatch):
    api = request_parts["request.api"]
    exporter, _ = api_telemetry
    monkeypatch.setattr(request.settle, "_SETTLE_GIVE_UP_S", 0.1)

    async def scenario():
        agen = await _first_output(engine, "cmpl-idle-1", max_tokens=2)
        engine.step("cmpl-idle-1", 22, finish=True)
        await asyncio.sleep(0.4)  # nobody reads: retries every 50 ms, then given up
        assert not api.book.settling
        await agen.aclose()  # leaving later changes nothing: it was reported

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)


def test_request_still_settling_at_exit_is_emitted_before_the_final_flush(
        engine, api_telemetry, request_parts):
    """A process that exits while a finished request's final output waits in its queue: the
    exit path (``bounded_export``'s callbacks before the final flush) emits it, not loses it."""
    api = request_parts["request.api"]
    from otel_ttft.runtime.telemetry import bounded_export

    exporter, _ = api_telemetry

    def request_spans():
        return [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]

    async def scenario():
        agen = await _first_output(engine, "cmpl-exit-1", max_tokens=2)
        engine.step("cmpl-exit-1", 22, finish=True)
        assert "cmpl-exit-1" in api.book.settling  # nobody took the final output yet
        assert not request_spans()
        assert api.settler.at_exit in bounded_export._Exit.callbacks
        api.settler.at_exit()  # what the exit path runs before the final flush
        assert not api.book.settling
        assert len(request_spans()) == 1
        await agen.aclose()  # leaving afterwards adds nothing

    asyncio.run(scenario())
    assert len(request_spans()) == 1
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)


def test_captured_output_text_comes_from_what_generate_handed_over(engine, api_telemetry,
                                                                   request_parts):
    """Content capture (opt-in) is the one case ``generate`` is wrapped: the text per choice."""
    exporter, _ = api_telemetry
    request_parts["request.api"].capture = True  # as a part made with capture on

    handed_over = []

    async def scenario():
        agen = engine.llm.generate("hello", params(3), "cmpl-text-1")
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        engine.step("cmpl-text-1", 21, first=True)
        handed_over.append(await first)
        engine.step("cmpl-text-1", 22)
        engine.step("cmpl-text-1", 23, finish=True)
        handed_over.extend([out async for out in agen])
        assert handed_over[-1].finished
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    (message,) = json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert message["parts"][0]["content"] == "".join(o.outputs[0].text for o in handed_over)
    assert len(message["parts"][0]["content"]) >= 3  # three tokens of text
    assert "hello" in attrs[semconv.GEN_AI_INPUT_MESSAGES]


def test_stop_string_found_by_the_detokenizer_ends_the_request(engine, api_telemetry,
                                                               request_parts):
    """vLLM's detokenizer stops the request (``reqs_to_abort``) although the engine did not."""
    api = request_parts["request.api"]
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    exporter, _ = api_telemetry
    params = SamplingParams(max_tokens=50, stop=["34"], temperature=0,
                            output_kind=RequestOutputKind.DELTA)

    async def scenario():
        agen = engine.llm.generate("hello", params, "cmpl-stop-1")
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        engine.step("cmpl-stop-1", 21, first=True)  # "2"
        await first
        engine.step("cmpl-stop-1", 22)  # "3"
        engine.step("cmpl-stop-1", 23)  # "4": "234" holds the stop string
        rest = [out async for out in agen]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "stop"
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert not api.book.live


