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
import time
from dataclasses import replace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import config, semconv, spans
from otel_ttft.hooks import request
from otel_ttft.hooks.registry import HookSet

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def telemetry():
    """A fresh SDK tracer and meter provider with in-memory export, handed to the hooks the way
    ``instrument(tracer_provider=..., meter_provider=...)`` does."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    config.configure(config.Config(tracer_provider=tracer_provider, meter_provider=meter_provider,
                                   request_detail=semconv.DETAIL_SPANS))  # every request's span
    spans.use_tracer_provider(tracer_provider)
    request.metrics.reset()
    hooks = HookSet([h for h in request.HOOKS if h.process == "api_server"])
    hooks.apply()
    yield exporter, reader
    hooks.remove()
    config.configure(config.Config())
    spans.use_tracer_provider(None)
    request.metrics.reset()
    request.state.live.clear()
    request.state.settling.clear()


class _EngineCore:
    """Stands in for the EngineCore client: records what it is asked to abort."""

    def __init__(self):
        self.aborted: list[str] = []

    async def abort_requests_async(self, request_ids):
        self.aborted.extend(request_ids)

    def shutdown(self, timeout=None):
        pass


class Engine:
    """A real ``AsyncLLM`` (its ``generate`` and ``abort``) over a real ``OutputProcessor``;
    outputs are fed by the test where vLLM's output handler would."""

    def __init__(self, tokenizer):
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import OutputProcessor

        self.processor = OutputProcessor(tokenizer, log_stats=True, stream_interval=1,
                                         tracing_enabled=False)
        llm = AsyncLLM.__new__(AsyncLLM)  # its __init__ starts an engine; generate does not
        llm.output_processor = self.processor
        llm.engine_core = _EngineCore()
        llm.log_requests = False
        llm.add_request = self._add_request
        self.llm = llm

    async def _add_request(self, request_id, prompt, params, **kwargs):
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import RequestOutputCollector

        core = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=[11, 12, 13, 14], mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=time.time(),
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id=request_id, trace_headers=kwargs.get("trace_headers"))
        queue = RequestOutputCollector(params.output_kind, request_id)
        self.processor.add_request(core, prompt, None, 0, queue)
        return queue

    def step(self, rid: str, token: int, *, first: bool = False, finish: bool = False) -> None:
        """One engine step's output for ``rid``, through the real ``process_outputs``."""
        from vllm.v1.engine import (
            EngineCoreEvent,
            EngineCoreEventType,
            EngineCoreOutput,
            FinishReason,
        )
        from vllm.v1.metrics.stats import IterationStats

        now = time.monotonic()
        events = ([EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, now - 0.002),
                   EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, now - 0.001)]
                  if first else None)
        out = EngineCoreOutput(request_id=rid, new_token_ids=[token], events=events,
                               finish_reason=FinishReason.LENGTH if finish else None)
        self.processor.process_outputs([out], now, IterationStats())


def _params(max_tokens: int):
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0,
                          output_kind=RequestOutputKind.DELTA)


def _request_span(exporter):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
    return span


async def _first_output(engine: Engine, rid: str, max_tokens: int = 8):
    agen = engine.llm.generate("hello", _params(max_tokens), rid)
    first = asyncio.ensure_future(agen.__anext__())
    await asyncio.sleep(0)  # generate's first step: add_request, then it waits for output
    engine.step(rid, 21, first=True)
    out = await first
    assert out.outputs[0].token_ids == [21]
    return agen


@pytest.fixture
def engine(tiny_model, telemetry):
    from vllm.tokenizers.registry import get_tokenizer

    return Engine(get_tokenizer(str(tiny_model)))


def test_client_leaves_after_the_engine_finished_but_before_the_final_output(engine, telemetry):
    """The flake's order of events: aborted, although the engine's finish reason is known."""
    exporter, _ = telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-late-1", max_tokens=3)
        engine.step("cmpl-late-1", 22)
        engine.step("cmpl-late-1", 23, finish=True)  # finished in the engine: output queued
        await agen.aclose()  # the client left before reading it

    asyncio.run(scenario())
    attrs = _request_span(exporter).attributes
    assert attrs.get(semconv.ATTR_REQUEST_ABORTED) is True
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)  # what the engine did
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3


def test_client_cancelled_while_waiting_for_the_next_output(engine, telemetry):
    """A disconnect cancels the task awaiting the next output: vLLM aborts; so do we."""
    exporter, _ = telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-cancel-1", max_tokens=200)
        waiting = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())
    assert engine.llm.engine_core.aborted == ["cmpl-cancel-1"]
    attrs = _request_span(exporter).attributes
    assert attrs.get(semconv.ATTR_REQUEST_ABORTED) is True
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1


def test_final_output_read_then_the_client_leaves_is_not_aborted(engine, telemetry):
    exporter, reader = telemetry

    async def scenario():
        agen = await _first_output(engine, "chatcmpl-done-1", max_tokens=2)
        engine.step("chatcmpl-done-1", 22, finish=True)
        last = await agen.__anext__()
        assert last.finished
        await agen.aclose()

    asyncio.run(scenario())
    span = _request_span(exporter)
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


def test_stream_read_to_its_end_is_emitted_once_the_caller_took_the_final_output(engine,
                                                                                 telemetry):
    """No wrapper around ``generate``: the record waits until its final output left the queue."""
    exporter, _ = telemetry

    async def scenario():
        agen = await _first_output(engine, "cmpl-end-1", max_tokens=2)
        engine.step("cmpl-end-1", 22, finish=True)
        assert "cmpl-end-1" in request.state.settling  # finished, output not yet taken
        await asyncio.sleep(0)  # the loop runs our look: the output is still in the queue
        assert not [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
        rest = [out async for out in agen]
        assert [o.finished for o in rest] == [True]
        await asyncio.sleep(0.2)  # the retry look finds the queue empty
        assert not request.state.settling

    asyncio.run(scenario())
    attrs = _request_span(exporter).attributes
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.ATTR_REQUEST_STREAMING] is True
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


def test_caller_that_stops_reading_is_emitted_as_finished_after_the_give_up(engine, telemetry,
                                                                             monkeypatch):
    exporter, _ = telemetry
    monkeypatch.setattr(request.api, "_SETTLE_GIVE_UP_S", 0.1)

    async def scenario():
        agen = await _first_output(engine, "cmpl-idle-1", max_tokens=2)
        engine.step("cmpl-idle-1", 22, finish=True)
        await asyncio.sleep(0.4)  # nobody reads: retries every 50 ms, then given up
        assert not request.state.settling
        await agen.aclose()  # leaving later changes nothing: it was reported

    asyncio.run(scenario())
    attrs = _request_span(exporter).attributes
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)


def test_captured_output_text_comes_from_what_generate_handed_over(engine, telemetry):
    """Content capture (opt-in) is the one case ``generate`` is wrapped: the text per choice."""
    exporter, _ = telemetry
    config.configure(replace(config.current, capture_content=True))

    handed_over = []

    async def scenario():
        agen = engine.llm.generate("hello", _params(3), "cmpl-text-1")
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
    attrs = _request_span(exporter).attributes
    (message,) = json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert message["parts"][0]["content"] == "".join(o.outputs[0].text for o in handed_over)
    assert len(message["parts"][0]["content"]) >= 3  # three tokens of text
    assert "hello" in attrs[semconv.GEN_AI_INPUT_MESSAGES]


def test_stop_string_found_by_the_detokenizer_ends_the_request(engine, telemetry):
    """vLLM's detokenizer stops the request (``reqs_to_abort``) although the engine did not."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    exporter, _ = telemetry
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
    attrs = _request_span(exporter).attributes
    assert attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert semconv.ATTR_REQUEST_ABORTED not in attrs
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert not request.state.live
