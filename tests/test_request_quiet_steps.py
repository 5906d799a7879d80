"""The API process's per-step hook stands aside once no request waits for its first two tokens
(vLLM's own ``process_outputs`` runs, ``registry.bypass``), and a request that can be watched
on its own ``LogprobsProcessor`` (``api.FirstOutputs``) never brings it back; requests still
end, through ``OutputProcessor._update_stats_from_finished``, with what vLLM counted meanwhile.
On vLLM's real ``AsyncLLM.generate`` and ``OutputProcessor`` (``tests/request_engine.py``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import HookSet
from tests.request_engine import Engine, params, request_span

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _bypassed(engine: Engine) -> bool:
    from vllm.v1.engine.output_processor import OutputProcessor

    bound = vars(engine.processor).get("process_outputs")
    return bound is not None and bound.__func__ is OutputProcessor.process_outputs.__wrapped__


def _output(engine: Engine, rid: str, tokens: list[int], *, events=None, finish=None) -> None:
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.metrics.stats import IterationStats

    out = EngineCoreOutput(request_id=rid, new_token_ids=tokens, events=events,
                           finish_reason=finish)
    engine.processor.process_outputs([out], time.monotonic(), IterationStats())


async def _drain(agen) -> list:
    return [out async for out in agen]


def test_steps_after_the_second_token_run_vllms_own_process_outputs(engine, api_telemetry):
    exporter, _ = api_telemetry

    async def scenario():
        agen = engine.llm.generate("hello", params(6), "cmpl-quiet-1")
        reader = asyncio.ensure_future(_drain(agen))
        await asyncio.sleep(0)  # generate's first step: add_request
        assert not _bypassed(engine)
        engine.step("cmpl-quiet-1", 21, first=True)
        engine.step("cmpl-quiet-1", 22)  # its second token: nothing left to look at
        assert _bypassed(engine)
        for token in (23, 24, 25):
            engine.step("cmpl-quiet-1", token)
        engine.step("cmpl-quiet-1", 26, finish=True)  # ends without a frame of ours per step
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
    assert not request.state.live and not request.state.fresh


def _watched(engine: Engine, rid: str) -> bool:
    """Our ``FirstOutputs`` sits on the request's own ``LogprobsProcessor``."""
    processor = engine.processor.request_states[rid].logprobs_processor
    return isinstance(vars(processor).get("update_from_output"), request.api.FirstOutputs)


def _two_requests(engine: Engine, check) -> None:
    async def scenario():
        first = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(4), "cmpl-a")))
        await asyncio.sleep(0)
        engine.step("cmpl-a", 21, first=True)
        engine.step("cmpl-a", 22)
        assert _bypassed(engine)
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


def test_a_new_request_is_watched_on_its_own_processor_not_every_step(engine, api_telemetry):
    """Its first two outputs reach our ``FirstOutputs`` on its own ``LogprobsProcessor``; the
    per-step hook stays aside throughout, and the processor is vLLM's own again after the
    second token."""
    exporter, _ = api_telemetry

    def check(moment: str) -> None:
        assert _bypassed(engine)  # no frame of ours a step
        assert _watched(engine, "cmpl-b") is (moment != "second")
        assert not _watched(engine, "cmpl-a")

    _two_requests(engine, check)
    spans = _request_spans(exporter)
    assert spans["cmpl-b"].attributes[semconv.ATTR_REQUEST_SCHEDULE_KNOWN] is True
    assert not request.state.live and not request.state.fresh


def test_a_request_that_cannot_be_watched_brings_the_per_step_hook_back(engine, api_telemetry,
                                                                        monkeypatch):
    """Where its own processor cannot carry the look (vLLM's stats logging off, a pooling
    request), every step is looked at again until its second token."""
    exporter, _ = api_telemetry
    monkeypatch.setattr(request.api, "_watch", lambda *args: False)

    def check(moment: str) -> None:
        assert _bypassed(engine) is (moment == "second")
        assert not _watched(engine, "cmpl-b")

    _two_requests(engine, check)
    _request_spans(exporter)


def test_a_request_that_ends_while_watched_leaves_vllms_processor_as_it_was(engine,
                                                                           api_telemetry):
    """Ended (or aborted) before its second token: nothing of ours stays on vLLM's objects."""
    exporter, _ = api_telemetry

    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(1), "cmpl-1")))
        await asyncio.sleep(0)
        processor = engine.processor.request_states["cmpl-1"].logprobs_processor
        assert _watched(engine, "cmpl-1")
        engine.step("cmpl-1", 21, first=True, finish=True)
        await reader
        await asyncio.sleep(0)
        return processor

    processor = asyncio.run(scenario())
    assert "update_from_output" not in vars(processor)
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
    assert attrs[semconv.ATTR_REQUEST_TTFT] > 0


def test_a_stop_string_found_in_a_quiet_step_ends_the_request_as_stopped(engine, api_telemetry):
    """The detokenizer ends it; EngineCore's output does not say so (vLLM aborts it there)."""
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
            assert _bypassed(engine) or token == ids[1]
            _output(engine, "cmpl-stop", [token])
        await reader
        await asyncio.sleep(0)

    asyncio.run(scenario())
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert not request.state.live


def test_preemptions_in_quiet_steps_are_counted_from_vllms_stats(engine, api_telemetry):
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType

    exporter, _ = api_telemetry

    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(4), "cmpl-p")))
        await asyncio.sleep(0)
        engine.step("cmpl-p", 21, first=True)
        engine.step("cmpl-p", 22)
        assert _bypassed(engine)
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


def test_without_the_finish_hook_every_step_looks_for_ends(engine, api_telemetry):
    """A vLLM without ``_update_stats_from_finished``: the per-step hook keeps finding ends
    (a final output, or a stop string) and never stands aside."""
    exporter, _ = api_telemetry
    finish = request.api.FINISH_HOOK
    HookSet([finish]).remove()
    try:
        async def scenario():
            reader = asyncio.ensure_future(
                _drain(engine.llm.generate("hello", params(4), "cmpl-old")))
            await asyncio.sleep(0)
            engine.step("cmpl-old", 21, first=True)
            for token in (22, 23):
                engine.step("cmpl-old", token)
                assert not _bypassed(engine)
            engine.step("cmpl-old", 24, finish=True)
            await reader
            await asyncio.sleep(0)

        asyncio.run(scenario())
    finally:
        finish.applied = False
        HookSet([finish]).apply()
    attrs = request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
