"""The request-detail policy (issue 9, cost): every request keeps its span with its stage
durations; the stage children only where someone will look; and ``analyze`` reads the stages
from the attributes when the children were not built."""

from __future__ import annotations

import pytest

from otel_ttft import config, semconv
from otel_ttft import environment_variables as env
from otel_ttft.analysis.breakdown import collect
from otel_ttft.config import Config
from otel_ttft.hooks.request import detail
from otel_ttft.hooks.request import spans as request_spans
from otel_ttft.hooks.request.state import Handle, RequestRecord
from otel_ttft.hooks.request.timeline import SCHEDULED
from tests import analysis_fixtures as fx
from tests.otel_memory import memory_exporter


@pytest.fixture
def policy():
    def use(mode: str = "auto", slow_ms: str = "1000", ratio: str = "0") -> Config:
        cfg = Config.from_env({env.OTEL_TTFT_REQUEST_DETAIL: mode,
                               env.OTEL_TTFT_REQUEST_DETAIL_SLOW_MS: slow_ms,
                               env.OTEL_TTFT_REQUEST_DETAIL_RATIO: ratio})
        config.configure(cfg)
        detail.reset()
        return cfg

    before = config.current
    yield use
    config.configure(before)
    detail.reset()


def _record(ttft: float, model: str = "tiny", cold: bool = False, error: str | None = None):
    handle = Handle(None, None, model, streaming=False)
    rec = RequestRecord("req-1", "cmpl-1", handle, arrival=100.0)
    handle.records.append(rec)
    rec.model, rec.prompt_len, rec.out_tokens, rec.cold, rec.error = model, 12, 4, cold, error
    rec.queued = 100.0 + ttft * 0.1
    rec.schedule = [(SCHEDULED, 100.0 + ttft * 0.3)]
    rec.first_tok = rec.recv = 100.0 + ttft
    rec.second_tok = rec.first_tok + 0.01
    rec.params = type("Params", (), {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "n": 1,
                                     "max_tokens": 16, "frequency_penalty": 0.0,
                                     "presence_penalty": 0.0, "seed": None})()
    return rec


def _emit(rec):
    exporter = memory_exporter()
    exporter.clear()
    request_spans.emit_request(rec, now=rec.first_tok + 0.1)
    spans = exporter.get_finished_spans()
    (req,) = [s for s in spans if s.name == semconv.SPAN_REQUEST]
    return req, [s for s in spans if s is not req]


def test_a_warm_fast_request_is_one_span_with_its_stage_durations(policy):
    policy()
    req, kids = _emit(_record(0.020))
    assert kids == []
    a = req.attributes
    assert semconv.ATTR_REQUEST_DETAIL not in a
    assert a[semconv.ATTR_REQUEST_STAGE_FRONTEND_SECONDS] == pytest.approx(0.002)
    assert a[semconv.ATTR_REQUEST_STAGE_QUEUE_SECONDS] == pytest.approx(0.004)
    assert a[semconv.ATTR_REQUEST_STAGE_PREFILL_SECONDS] == pytest.approx(0.014)
    assert a[semconv.ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS] == pytest.approx(0.01)
    stage_sum = sum(a[semconv.REQUEST_STAGE_SECONDS[s]] for s in
                    (semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL))
    assert stage_sum == pytest.approx(a[semconv.ATTR_REQUEST_TTFT])
    # sampling parameters at their "not set" values are left out; set ones are kept
    assert semconv.GEN_AI_REQUEST_TOP_P not in a and semconv.GEN_AI_REQUEST_CHOICE_COUNT not in a
    assert a[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 16


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"ttft": 0.020, "cold": True}, semconv.DETAIL_COLD),
    ({"ttft": 1.5}, semconv.DETAIL_SLOW),
    ({"ttft": 0.020, "error": "EngineDeadError: gone"}, semconv.DETAIL_ERROR),
])
def test_cold_slow_and_failed_requests_get_their_stage_children(policy, kwargs, why):
    policy()
    req, kids = _emit(_record(**kwargs))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == why
    assert {k.name for k in kids} >= {semconv.SPAN_REQUEST_QUEUE, semconv.SPAN_REQUEST_PREFILL,
                                      semconv.SPAN_REQUEST_FIRST_DECODE}


def test_the_models_tail_gets_children_once_its_p95_is_known(policy):
    policy()
    for i in range(64):  # 64 requests of 20-26 ms: the tail threshold settles near 26 ms
        req, kids = _emit(_record(0.020 + (i % 7) * 0.001, model="m"))
        assert kids == [] or req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_TAIL
    req, kids = _emit(_record(0.080, model="m"))  # far below "slow", far above the tail
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_TAIL and kids
    req, kids = _emit(_record(0.080, model="other"))  # another model has no tail yet
    assert kids == []


def test_all_none_and_the_sampled_share(policy):
    policy("all")
    req, kids = _emit(_record(0.020))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_ALL and kids
    policy("none")
    req, kids = _emit(_record(5.0, cold=True))
    assert kids == [] and semconv.ATTR_REQUEST_STAGE_QUEUE_SECONDS in req.attributes
    policy(ratio="1")
    req, kids = _emit(_record(0.020))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_SAMPLED and kids
    policy(ratio="0.5")  # by the trace id's low 56 bits
    assert detail.sampled(1) and not detail.sampled((1 << 56) - 1)


def test_garbage_settings_fall_back_to_the_defaults(policy):
    s = policy("everything", slow_ms="fast", ratio="lots")
    assert (s.request_detail, s.detail_slow_s, s.detail_ratio) == (
        "auto", env.DEFAULT_REQUEST_DETAIL_SLOW_MS / 1000, env.DEFAULT_REQUEST_DETAIL_RATIO)
    assert policy(ratio="nan").detail_ratio == env.DEFAULT_REQUEST_DETAIL_RATIO
    assert policy(ratio="7").detail_ratio == 1.0


def test_analyze_reads_the_stages_from_a_request_span_without_children():
    with_children = fx.request("s", "m", made=10.0, arrival=10.001, queue=0.030, prefill=0.012)
    server = next(s for s in with_children if s["name"] == semconv.SPAN_REQUEST)
    bare = [s for s in with_children if s["parent_span_id"] != server["span_id"]]
    stage_attrs = {semconv.STAGE_FRONTEND: 0.004, semconv.STAGE_QUEUE: 0.030,
                   semconv.STAGE_PREFILL: 0.012}
    server["attributes"].update({semconv.REQUEST_STAGE_SECONDS[k]: v
                                 for k, v in stage_attrs.items()})

    def totals(spans):
        (request,) = collect([spans]).requests
        out: dict[str, float] = {}
        for start, end, stage in request.segments:
            out[stage] = out.get(stage, 0.0) + (end - start) / 1e9
        return out

    got, want = totals(bare), totals(with_children)
    assert got.keys() == want.keys() == stage_attrs.keys()
    for stage in want:
        assert got[stage] == pytest.approx(want[stage], abs=2e-6)
