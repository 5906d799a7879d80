"""The request-detail policy (issue 9, cost): every request is counted in the metrics; by default
only the requests someone will open get a span (with their stage children), and those the caller
traces get theirs (stage durations as attributes); ``analyze`` reads the stages from the
attributes when the children were not built. Per the contrib habit: fresh providers per test."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.runtime import environment_variables as env
from otel_ttft.runtime.config import Config
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.hooks.request.timeline import SCHEDULED
from otel_ttft.tools.analysis.breakdown import collect
from tests import analysis_fixtures as fx
from tests.request_engine import api_part, use_config

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NOT_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


class _Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def ttft_count(self) -> int:
        data = self.reader.get_metrics_data()
        if data is None:  # nothing recorded at all
            return 0
        return sum(p.count for rm in data.resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics if m.name == semconv.METRIC_SERVER_TTFT
                   for p in m.data.data_points)


@pytest.fixture
def policy():
    telemetry = _Telemetry()

    def use(mode: str = "auto", slow_ms: str = "1000", ratio: str = "0") -> Config:
        cfg = Config.from_env({env.OTEL_TTFT_REQUEST_DETAIL: mode,
                               env.OTEL_TTFT_REQUEST_DETAIL_SLOW_MS: slow_ms,
                               env.OTEL_TTFT_REQUEST_DETAIL_RATIO: ratio},
                              tracer_provider=telemetry.tracer_provider,
                              meter_provider=telemetry.meter_provider)
        use_config(cfg)
        use.part = api_part()
        return cfg

    use.telemetry = telemetry
    yield use
    use_config(Config())


def _record(ttft: float, model: str = "tiny", cold: bool = False, error: str | None = None,
            traceparent: str | None = None):
    rec = RequestRecord("req-1", "cmpl-1", arrival=100.0)
    rec.trace_headers = {"traceparent": traceparent} if traceparent else None
    rec.model, rec.prompt_len, rec.out_tokens, rec.cold, rec.error = model, 12, 4, cold, error
    rec.queued = 100.0 + ttft * 0.1
    rec.schedule = [(SCHEDULED, 100.0 + ttft * 0.3)]
    rec.first_tok = rec.recv = 100.0 + ttft
    rec.second_tok = rec.first_tok + 0.01
    rec.params = type("Params", (), {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "n": 1,
                                     "max_tokens": 16, "frequency_penalty": 0.0,
                                     "presence_penalty": 0.0, "seed": None})()
    return rec


def _emit(policy, rec):
    """The request span (or None) and its other spans."""
    exporter = policy.telemetry.exporter
    exporter.clear()
    policy.part.emitter.emit(rec, now=rec.first_tok + 0.1)
    got = exporter.get_finished_spans()
    reqs = [s for s in got if s.name == semconv.SPAN_REQUEST]
    assert len(reqs) <= 1
    return (reqs[0] if reqs else None), [s for s in got if s.name != semconv.SPAN_REQUEST]


def _assert_stage_durations(a):
    assert a[semconv.ATTR_REQUEST_STAGE_FRONTEND_SECONDS] == pytest.approx(0.002)
    assert a[semconv.ATTR_REQUEST_STAGE_QUEUE_SECONDS] == pytest.approx(0.004)
    assert a[semconv.ATTR_REQUEST_STAGE_PREFILL_SECONDS] == pytest.approx(0.014)
    assert a[semconv.ATTR_REQUEST_STAGE_FIRST_DECODE_SECONDS] == pytest.approx(0.01)
    stage_sum = sum(a[semconv.REQUEST_STAGE_SECONDS[s]] for s in
                    (semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL))
    assert stage_sum == pytest.approx(a[semconv.ATTR_REQUEST_TTFT])


def test_a_warm_fast_untraced_request_is_counted_without_a_span(policy):
    """No span, but its sample: vLLM's own histograms split neither cold from warm nor TTFT
    into stages."""
    policy()
    req, kids = _emit(policy, _record(0.020))
    assert req is None and kids == []
    assert policy.telemetry.ttft_count() == 1
    policy("none")  # cold, and still no span: counted too
    req, kids = _emit(policy, _record(0.020, cold=True))
    assert req is None and kids == []
    assert policy.telemetry.ttft_count() == 2


def test_a_request_the_caller_traces_gets_its_span_with_stage_durations(policy):
    policy()
    req, kids = _emit(policy, _record(0.020, traceparent=SAMPLED))
    assert kids == [] and req is not None
    assert req.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c
    a = req.attributes
    assert semconv.ATTR_REQUEST_DETAIL not in a
    _assert_stage_durations(a)
    # sampling parameters at their "not set" values are left out; set ones are kept
    assert semconv.GEN_AI_REQUEST_TOP_P not in a and semconv.GEN_AI_REQUEST_CHOICE_COUNT not in a
    assert a[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 16


def test_an_unsampled_caller_is_honoured_even_for_a_slow_request(policy):
    policy()
    req, kids = _emit(policy, _record(1.5, traceparent=NOT_SAMPLED))
    assert req is None and kids == []  # the parent-based sampler said no
    assert policy.telemetry.ttft_count() == 1  # still counted


def test_with_vllms_own_tracing_on_every_request_keeps_its_span(policy):
    """vLLM's ``--otlp-traces-endpoint`` asks for a span per request; ours replaces vLLM's, so the
    default policy must not drop it."""
    policy()
    rec = _record(0.020)
    rec.vllm = {semconv.VLLM_LATENCY_TTFT: 0.019}
    req, kids = _emit(policy, rec)
    assert req is not None and kids == []
    assert req.attributes[semconv.VLLM_LATENCY_TTFT] == 0.019


def test_spans_policy_gives_every_request_its_span(policy):
    policy("spans")
    req, kids = _emit(policy, _record(0.020))
    assert req is not None and kids == []
    _assert_stage_durations(req.attributes)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"ttft": 0.020, "cold": True}, semconv.DETAIL_COLD),
    ({"ttft": 1.5}, semconv.DETAIL_SLOW),
    ({"ttft": 0.020, "error": "EngineDeadError: gone"}, semconv.DETAIL_ERROR),
])
def test_cold_slow_and_failed_requests_get_their_span_and_stage_children(policy, kwargs, why):
    policy()
    req, kids = _emit(policy, _record(**kwargs))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == why
    assert {k.name for k in kids} >= {semconv.SPAN_REQUEST_QUEUE, semconv.SPAN_REQUEST_PREFILL,
                                      semconv.SPAN_REQUEST_FIRST_DECODE}


def test_the_models_tail_gets_children_once_its_p99_is_known(policy):
    policy()
    for i in range(64):  # 64 requests of 20-26 ms: the tail threshold settles near 26 ms
        req, kids = _emit(policy, _record(0.020 + (i % 7) * 0.001, model="m"))
        assert req is None or req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_TAIL
    req, kids = _emit(policy, _record(0.080, model="m"))  # far below "slow", above the tail
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_TAIL and kids
    req, kids = _emit(policy, _record(0.080, model="other"))  # another model has no tail yet
    assert req is None
    assert policy.telemetry.ttft_count() == 66  # every request counted, span or not


def test_all_none_and_the_sampled_share(policy):
    policy("all")
    req, kids = _emit(policy, _record(0.020))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_ALL and kids
    policy("none")
    req, kids = _emit(policy, _record(5.0, cold=True))
    assert req is None and kids == []
    req, kids = _emit(policy, _record(5.0, cold=True, traceparent=SAMPLED))
    assert kids == [] and semconv.ATTR_REQUEST_STAGE_QUEUE_SECONDS in req.attributes
    policy(ratio="1")
    req, kids = _emit(policy, _record(0.020))
    assert req.attributes[semconv.ATTR_REQUEST_DETAIL] == semconv.DETAIL_SAMPLED and kids
    policy(ratio="0.5")  # a traced request: by the trace id's low 56 bits, as every party agrees
    sampled = policy.part.emitter.detail.sampled
    assert sampled(1) and not sampled((1 << 56) - 1)
    draws = [sampled(None) for _ in range(2000)]  # untraced: a private random draw
    assert 800 < sum(draws) < 1200


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


def test_a_request_without_children_keeps_its_named_wait():
    """A slow request the policy gave no children (a model's tail) still has the wait its
    attributes name: ``prefill.wait`` out of its Prefill, the rest prefill."""
    spans = fx.request("s", "m", made=10.0, arrival=10.001, queue=0.030, prefill=1.012)
    server = next(s for s in spans if s["name"] == semconv.SPAN_REQUEST)
    bare = [s for s in spans if s["parent_span_id"] != server["span_id"]]
    server["attributes"].update({semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_FRONTEND]: 0.004,
                                 semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_QUEUE]: 0.030,
                                 semconv.REQUEST_STAGE_SECONDS[semconv.STAGE_PREFILL]: 1.012,
                                 semconv.ATTR_REQUEST_WAIT_SECONDS: 1.0})
    (request,) = collect([bare]).requests
    out: dict[str, float] = {}
    for start, end, stage in request.segments:
        out[stage] = out.get(stage, 0.0) + (end - start) / 1e9
    assert out[semconv.STAGE_PREFILL_WAIT] == pytest.approx(1.0, abs=2e-6)
    assert out[semconv.STAGE_PREFILL] == pytest.approx(0.012, abs=2e-6)
