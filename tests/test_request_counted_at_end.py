"""Under the default policy a warm request nobody traces gets no record: vLLM's own stats are
read when it ends (``api._counted_at_end``, ``settle.end_from_stats``), and it still gives its
TTFT sample and stage times, its span where it is slow, failed or aborted. The first such request
after a quiet second and the sampled share keep their record. On vLLM's real ``AsyncLLM.generate``
and ``OutputProcessor`` (``tests/request_engine.py``)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.hooks import request
from tests.request_engine import Engine, params

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _points(reader, name):
    data = reader.get_metrics_data()
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == name for p in m.data.data_points]


def _default_policy(**settings) -> None:
    config.configure(replace(config.current, **{"request_detail": semconv.DETAIL_AUTO,
                                                "detail_ratio": 0.0, **settings}))


@pytest.fixture
def busy(monkeypatch):
    """A request got its record just now: the next warm ones go without (``RECORD_EVERY_S``)."""
    monkeypatch.setattr(request.api, "_last_record", [time.monotonic()])
    monkeypatch.setattr(request.state, "counted_at_end", False)


async def _drain(agen) -> list:
    return [out async for out in agen]


def _serve(engine: Engine, rid: str, tokens: int, seen: dict | None = None) -> list:
    async def scenario():
        reader = asyncio.ensure_future(_drain(engine.llm.generate("hello", params(tokens), rid)))
        await asyncio.sleep(0)  # generate's first step: add_request
        if seen is not None:
            seen["recorded"] = rid in request.state.live
        for i in range(tokens):
            engine.step(rid, 21 + i, first=i == 0, finish=i == tokens - 1)
        outs = await reader
        await asyncio.sleep(0)  # the emission's turn of the event loop
        return outs

    return asyncio.run(scenario())


def _request_spans(exporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]


def test_a_warm_untraced_request_is_counted_from_vllms_stats_without_a_record(
        engine, api_telemetry, busy):
    exporter, reader = api_telemetry
    _default_policy()
    seen: dict = {}
    outs = _serve(engine, "cmpl-lean-1", 4, seen)
    assert sum(len(o.outputs[0].token_ids) for o in outs) == 4
    assert seen["recorded"] is False  # no record, nothing on its LogprobsProcessor
    assert not request.state.live and not request.state.settling
    (ttft,) = _points(reader, semconv.METRIC_SERVER_TTFT)
    assert ttft.count == 1 and 0 < ttft.sum < 5
    assert ttft.attributes[semconv.ATTR_REQUEST_COLD] is False
    stages = {p.attributes[semconv.ATTR_STAGE]: p.value
              for p in _points(reader, semconv.METRIC_REQUEST_STAGE_TIME)}
    # vLLM's QUEUED and SCHEDULED events and its first token's step tile the sample
    assert set(stages) == {semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL}
    assert math.isclose(sum(stages.values()), ttft.sum, rel_tol=1e-6)
    assert _request_spans(exporter) == []  # warm, fast, untraced: no span under ``auto``


def test_the_first_after_a_quiet_second_and_the_sampled_share_keep_their_record(
        engine, api_telemetry, busy, monkeypatch):
    exporter, _ = api_telemetry
    _default_policy()
    monkeypatch.setattr(request.api, "_last_record", [-math.inf])
    seen: dict = {}
    _serve(engine, "cmpl-quiet-1", 3, seen)
    assert seen["recorded"] is True
    _serve(engine, "cmpl-busy-1", 3, seen)  # within the second: counted at its end
    assert seen["recorded"] is False
    _default_policy(detail_ratio=1.0)  # every one drawn: a record, a span with its children
    _serve(engine, "cmpl-drawn-1", 3, seen)
    assert seen["recorded"] is True
    (span,) = _request_spans(exporter)
    assert span.attributes[semconv.VLLM_REQUEST_ID] == "cmpl-drawn-1"
    assert span.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_SAMPLED
    assert span.attributes[semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_FIRST_DECODE]] >= 0
    children = {s.name for s in exporter.get_finished_spans()
                if s.parent is not None and s.parent.span_id == span.context.span_id}
    assert semconv.SPAN_REQUEST_PREFILL in children


@pytest.mark.parametrize("detail", [semconv.DETAIL_SPANS, semconv.DETAIL_ALL])
def test_a_policy_that_wants_every_span_keeps_every_record(engine, api_telemetry, busy, detail):
    exporter, _ = api_telemetry
    config.configure(replace(config.current, request_detail=detail))
    seen: dict = {}
    _serve(engine, "cmpl-every-1", 3, seen)
    assert seen["recorded"] is True
    assert len(_request_spans(exporter)) == 1


def test_a_slow_one_gets_its_span_from_vllms_stats(engine, api_telemetry, busy):
    exporter, reader = api_telemetry
    _default_policy(detail_slow_s=0.0)  # every TTFT is slow
    _serve(engine, "cmpl-slow-1", 3)
    (span,) = _request_spans(exporter)
    attrs = span.attributes
    assert attrs[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_SLOW
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert attrs[semconv.ATTR_REQUEST_TTFT] == pytest.approx(
        _points(reader, semconv.METRIC_SERVER_TTFT)[0].sum)
    children = {s.name for s in exporter.get_finished_spans()
                if s.parent is not None and s.parent.span_id == span.context.span_id}
    assert {semconv.SPAN_REQUEST_INPUT, semconv.SPAN_REQUEST_QUEUE,
            semconv.SPAN_REQUEST_PREFILL} <= children


def test_a_client_that_leaves_is_reported_aborted_without_a_record(engine, api_telemetry, busy):
    exporter, _ = api_telemetry
    _default_policy()

    async def scenario():
        agen = engine.llm.generate("hello", params(200), "cmpl-gone-1")
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        assert "cmpl-gone-1" not in request.state.live
        engine.step("cmpl-gone-1", 21, first=True)
        await first
        waiting = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert engine.llm.engine_core.aborted == ["cmpl-gone-1"]
    (span,) = _request_spans(exporter)
    assert span.attributes[semconv.ATTR_REQUEST_ABORTED] is True
    assert span.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_ERROR
    assert span.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
