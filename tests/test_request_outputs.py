"""Each request's first two outputs are read in the step they come in, later steps leave it
alone, and requests end through ``OutputProcessor._update_stats_from_finished`` with what vLLM
counted meanwhile (tokens, preemptions, a stop string). On vLLM's real ``AsyncLLM.generate`` and
``OutputProcessor`` (``tests/request_engine.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from otel_ttft import semconv
from tests.request_engine import Engine, params, request_span

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _output(engine: Engine, rid: str, tokens: list[int], *, events=None, finish=None) -> None:
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.metrics.stats import IterationStats

    out = EngineCoreOutput(request_id=rid, new_token_ids=tokens, events=events,
                           finish_reason=finish)
    engine.processor.process_outputs([out], time.monotonic(), IterationStats())


async def _drain(agen) -> list:
    return [out async for out in agen]


def test_steps_after_the_second_token_leave_the_request_alone(engine, api_telemetry, request_parts):
    api = request_parts["request.api"]
    exporter, _ = api_telemetry

    async def scenario():
        agen = engine.llm.generate("hello", params(6), "cmpl-quiet-1")
        reader = asyncio.ensure_future(_drain(agen))
        await asyncio.sleep(0)  # generate's first step: add_request
        assert "cmpl-quiet-1" in api.book.fresh
        engine.step("cmpl-quiet-1", 21, first=True)
        engine.step("cmpl-quiet-1", 22)  # its second token: nothing left to look at
        assert "cmpl-quiet-1" not in api.book.fresh
        for token in (23, 24, 25):
            engine.step("cmpl-quiet-1", token)
        engine.step("cmpl-quiet-1", 26, finish=True)
        outs = await reader
        await asyncio.sleep(0)  # the emission's turn of the event loop
        return outs

    outs = asyncio.run(scenario())
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 6
    span = request_span(exporter)
    attrs = span.attributes
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_FIRST_DECODE]] >= 0
    assert not api.book.live and not api.book.fresh


def _two_requests(engine: Engine, check) -> None:
    async def scenario():
        first = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(4), "cmpl-a")))
        await asyncio.sleep(0)
        engine.step("cmpl-a", 21, first=True)
        engine.step("cmpl-a", 22)
        second = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(3), "cmpl-b")))
        await asyncio.sleep(0)
        check("added")
        engine.step("cmpl-b", 31, first=True)
        engine.step("cmpl-a", 23)
        check("first")
        engine.step("cmpl-b", 32)
        check("second")
        engine.step("cmpl-b", 33, finish=True)
        engine.step("cmpl-a", 24, finish=True)
        await asyncio.gather(first, second)
        await asyncio.sleep(0)

    asyncio.run(scenario())


def _request_spans(exporter) -> dict:
    spans = {s.attributes[semconv.VLLM_REQUEST_ID]: s for s in exporter.get_finished_spans()
             if s.name == semconv.SPAN_REQUEST}
    assert set(spans) == {"cmpl-a", "cmpl-b"}
    for span in spans.values():  # both measured from their own first two outputs
        assert span.attributes[semconv.ATTR_REQUEST_TTFT] > 0
        assert span.attributes[semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_FIRST_DECODE]] >= 0
    assert spans["cmpl-b"].attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    return spans


def test_two_requests_are_each_measured_from_their_own_first_outputs(engine, api_telemetry,
                                                                     request_parts):
    api = request_parts["request.api"]
    exporter, _ = api_telemetry

    def check(moment: str) -> None:
        assert ("cmpl-b" in api.book.fresh) is (moment != "second")
        assert "cmpl-a" not in api.book.fresh

    _two_requests(engine, check)
    spans = _request_spans(exporter)
    assert spans["cmpl-b"].attributes[semconv.ATTR_REQUEST_SCHEDULE_KNOWN] is True
    assert not api.book.live and not api.book.fresh


def test_a_request_that_ends_at_its_first_token(engine, api_telemetry, request_parts):
    api = request_parts["request.api"]
    exporter, _ = api_telemetry

    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(1), "cmpl-1")))
        await asyncio.sleep(0)
        engine.step("cmpl-1", 21, first=True, finish=True)
        await reader
        await asyncio.sleep(0)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
    assert attrs[semconv.ATTR_REQUEST_TTFT] > 0
    assert not api.book.live and not api.book.fresh


def test_a_stop_string_found_in_a_quiet_step_ends_the_request_as_stopped(engine, api_telemetry,
                                                                         request_parts):
    """The detokenizer ends it; EngineCore's output does not say so (vLLM aborts it there)."""
    api = request_parts["request.api"]
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    exporter, _ = api_telemetry
    ids = engine.processor.tokenizer.encode(" one two three four five", add_special_tokens=False)
    stop = SamplingParams(max_tokens=50, stop=["four"], temperature=0,
                          output_kind=RequestOutputKind.DELTA)

    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", stop, "cmpl-stop")))
        await asyncio.sleep(0)
        engine.step("cmpl-stop", ids[0], first=True)
        for token in ids[1:]:
            if "cmpl-stop" not in engine.processor.request_states:
                break
            _output(engine, "cmpl-stop", [token])
        await reader
        await asyncio.sleep(0)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert not api.book.live


def test_preemptions_after_the_first_tokens_are_counted_from_vllms_stats(engine, api_telemetry):
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType

    exporter, _ = api_telemetry

    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(4), "cmpl-p")))
        await asyncio.sleep(0)
        engine.step("cmpl-p", 21, first=True)
        engine.step("cmpl-p", 22)
        now = time.monotonic()
        _output(engine, "cmpl-p", [23], events=[
            EngineCoreEvent.new_event(EngineCoreEventType.PREEMPTED, now - 0.002),
            EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, now - 0.001)])
        engine.step("cmpl-p", 24, finish=True)
        await reader
        await asyncio.sleep(0)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs[semconv.ATTR_REQUEST_PREEMPTIONS] == 1
