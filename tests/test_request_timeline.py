"""The request path without a server: the tiling rule, the EngineCore -> API payload, and the span
tree built from one request's timestamps through the real OTel SDK (in memory)."""

from __future__ import annotations

import json

import pytest

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks.request import payload
from otel_ttft.runtime.hooks.request.payload import EnginePayload
from otel_ttft.runtime.hooks.request.state import FirstChunk, RequestRecord
from otel_ttft.runtime.hooks.request.timeline import (
    PREEMPTED,
    SCHEDULED,
    stage_durations,
    stage_totals,
    tile,
)
from tests.request_engine import api_part

FRONTEND, QUEUE, PREFILL = semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL


def stages(segments):
    return [(s.stage, s.name) for s in segments]


def assert_tiled(segments, start, end):
    assert segments[0].start == start
    assert segments[-1].end == end
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start


def test_plain_request_tiles_arrival_to_handover():
    segs = tile(10.0, 10.002, [(SCHEDULED, 10.005)], 10.020, 10.021, end=10.100)
    assert stages(segs) == [(FRONTEND, semconv.SPAN_REQUEST_INPUT),
                            (QUEUE, semconv.SPAN_REQUEST_QUEUE),
                            (PREFILL, semconv.SPAN_REQUEST_PREFILL),
                            (FRONTEND, semconv.SPAN_REQUEST_OUTPUT)]
    assert_tiled(segs, 10.0, 10.021)
    totals = stage_totals(segs)
    assert totals[FRONTEND] == pytest.approx(0.002 + 0.001)
    assert totals[QUEUE] == pytest.approx(0.003)
    assert totals[PREFILL] == pytest.approx(0.015)


def test_preemption_before_first_token_requeues():
    schedule = [(SCHEDULED, 1.1), (PREEMPTED, 1.2), (SCHEDULED, 1.5), (PREEMPTED, 2.5)]
    segs = tile(1.0, 1.05, schedule, first_token=2.0, ttft_end=2.01, end=3.0)
    assert [s.stage for s in segs] == [FRONTEND, QUEUE, PREFILL, QUEUE, PREFILL, FRONTEND]
    assert_tiled(segs, 1.0, 2.01)
    assert stage_totals(segs)[QUEUE] == pytest.approx(0.05 + 0.3)


def test_without_schedule_times_queue_and_prefill_are_one_segment():
    segs = tile(1.0, 1.1, [], first_token=1.5, ttft_end=1.6, end=2.0)
    assert [s.stage for s in segs] == [FRONTEND, PREFILL, FRONTEND]
    assert_tiled(segs, 1.0, 1.6)


def test_request_that_never_got_a_token_ends_in_the_stage_it_was_in():
    segs = tile(1.0, 1.01, [], first_token=None, ttft_end=None, end=4.0)
    assert [s.stage for s in segs] == [FRONTEND, PREFILL]
    segs = tile(1.0, 1.01, [(SCHEDULED, 2.0), (PREEMPTED, 3.0)], None, None, end=4.0)
    assert [s.stage for s in segs] == [FRONTEND, QUEUE, PREFILL, QUEUE]
    assert_tiled(segs, 1.0, 4.0)


def test_out_of_order_clocks_are_clamped_never_negative():
    # queued before arrival (clock mapping), scheduled after the first token.
    segs = tile(5.0, 4.9, [(SCHEDULED, 5.3)], first_token=5.2, ttft_end=5.25, end=6.0)
    assert all(s.end >= s.start for s in segs)
    assert_tiled(segs, 5.0, 5.25)
    assert sum(s.end - s.start for s in segs) == pytest.approx(0.25)


def test_stage_durations_are_the_tiles_totals_whatever_the_clocks():
    """The arithmetic path (no segments, for requests without a span) never disagrees with the
    tiling rule, clocks out of order included."""
    import random

    rng = random.Random(7)
    fast = 0
    for _ in range(5000):
        arrival = 10.0
        t = [arrival + rng.uniform(-0.01, 0.05) for _ in range(4)]
        if rng.random() < 0.5:  # clocks in order, as they nearly always are
            t = sorted(max(v, arrival) for v in t)
        queued = None if rng.random() < 0.1 else t[0]
        schedule = rng.choice([[(SCHEDULED, t[1])], [(SCHEDULED, t[1])], [],
                               [(SCHEDULED, t[1]), (PREEMPTED, t[2]), (SCHEDULED, t[3])]])
        first, ttft_end = t[2], rng.choice([None, t[3], t[2] + 0.001])
        want = stage_totals(tile(arrival, queued, schedule, first, ttft_end, first + 1))
        got = stage_durations(arrival, queued, schedule, first, ttft_end)
        limit = first if ttft_end is None else ttft_end
        fast += (queued is not None and len(schedule) == 1
                 and arrival <= queued <= schedule[0][1] < first <= limit)
        assert got.keys() == want.keys()
        for stage in want:
            assert got[stage] == pytest.approx(want[stage], abs=1e-12), (stage, got, want)
    assert fast > 500  # the arithmetic path was taken, not only the fallback


def test_engine_payload_round_trip():
    st = EnginePayload(123.25, waiting=7, running=4, free=3, total=6, lora_id=2)
    st.attempts = 5
    st.schedule = [(SCHEDULED, 123.5), (PREEMPTED, 124.0), (SCHEDULED, 124.5)]
    st.adapter = (123.6, 123.7)
    compiled = payload.CompileTime(123.8, 124.9, "logprobs.py:batched_count_greater_than", "3/1",
                                   recompile=True, model_graph=False, step_tokens=17,
                                   step_requests=2)
    st.compile = [compiled]
    st.steps = [payload.StepTime(124.5, 125.6, wall=1.05, cpu=0.004)]
    st.engine_waits = [payload.EngineWait(124.4, 125.7, queued=0.9)]
    got = payload.decode(payload.encode(st))
    assert got == EnginePayload(123.25, waiting=7, running=4, free=3, total=6, attempts=5,
                                schedule=st.schedule, adapter=(123.6, 123.7),
                                compile=[compiled], steps=st.steps,
                                engine_waits=st.engine_waits)
    assert got.lora_id == 0  # EngineCore-side only: not shipped
    bare = payload.decode(payload.encode(EnginePayload(1.0, 0, 0, 1, 2)))
    assert (bare.schedule, bare.compile, bare.steps, bare.engine_waits) == ((), (), (), ())


@pytest.mark.parametrize("step", [[1.0, 2.0, 1.0, -0.5], [1.0, 2.0, float("nan"), 0.0],
                                  [1.0, 2.0, 1.0], "x"])
def test_engine_payload_refuses_a_step_it_cannot_read(step):
    value = json.loads(payload.encode(EnginePayload(1.0, 0, 0, 1, 2)).replace("NaN", "0"))
    value[10] = [step]  # the steps (the wire's order: payload.encode)
    assert payload.decode(json.dumps(value).replace("nan", "NaN")) is None


@pytest.mark.parametrize("wait", [[1.0, 2.0, -0.1], [1.0, 2.0, float("inf")], [1.0, 2.0],
                                  "x"])
def test_engine_payload_refuses_an_engine_wait_it_cannot_read(wait):
    value = json.loads(payload.encode(EnginePayload(1.0, 0, 0, 1, 2)))
    value[11] = [wait]
    assert payload.decode(json.dumps(value)) is None


@pytest.mark.parametrize("compiled", [[1.0, 2.0, "f.py:f", "0/0", False, False, -1, 1],
                                      [1.0, float("nan"), "f.py:f", "0/0", False, False, 1, 1],
                                      [1.0, 2.0, 3, "0/0", False, False, 1, 1],
                                      [1.0, 2.0, "f.py:f", "0/0", False, False, 1]])
def test_engine_payload_refuses_a_compile_it_cannot_read(compiled):
    value = json.loads(payload.encode(EnginePayload(1.0, 0, 0, 1, 2)))
    value[9] = [compiled]
    assert payload.decode(json.dumps(value)) is None


def test_a_request_reads_its_events_as_they_come_and_vllms_stats_at_its_end():
    """The first output's QUEUED and SCHEDULED are read as they come; a re-admission after a
    late preemption changes nothing that tiles; a request whose outputs carried no events takes
    the usual two from vLLM's stats when it ends."""
    from types import SimpleNamespace

    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput
    from vllm.v1.metrics.stats import RequestStateStats

    def events(*kinds_at):
        return [EngineCoreEvent(EngineCoreEventType[kind], at) for kind, at in kinds_at]

    rec = RequestRecord("w", "w", 1.0)
    rec.on_first(EngineCoreOutput("w", [7], events=events(("QUEUED", 1.1), ("SCHEDULED", 1.2))),
                 1.5, 1.6)
    assert (rec.queued, rec.schedule) == (1.1, [(SCHEDULED, 1.2)])
    rec.on_output(EngineCoreOutput("w", [8], events=events(("PREEMPTED", 1.7),
                                                            ("SCHEDULED", 1.75))), 1.8)
    assert rec.schedule == [(SCHEDULED, 1.2)] and rec.late_preemptions == [1.7]
    stats = RequestStateStats(num_generation_tokens=2, num_preemptions=1, queued_ts=1.1,
                              scheduled_ts=1.2, first_token_ts=1.5, last_token_ts=1.8)
    quiet = RequestRecord("q", "q", 1.0)
    quiet.on_first(EngineCoreOutput("q", [7]), 1.5, 1.6)
    quiet.state = SimpleNamespace(stats=stats)
    quiet.read_end(2.0)
    assert (quiet.queued, quiet.schedule, quiet.out_tokens) == (1.1, [(SCHEDULED, 1.2)], 2)
    assert quiet.preemptions == 1 and quiet.done == 2.0
    # a preemption before the first token: read from the output
    pre = RequestRecord("x", "x", 1.0)
    pre.on_first(EngineCoreOutput("x", [7], events=events(
        ("QUEUED", 1.1), ("SCHEDULED", 1.2), ("PREEMPTED", 1.3), ("SCHEDULED", 1.4))), 1.5, 1.6)
    assert pre.schedule == [(SCHEDULED, 1.2), (PREEMPTED, 1.3), (SCHEDULED, 1.4)]


@pytest.mark.parametrize("value", [
    "q=1.0;zz=unknown",  # the old hand-encoded string
    "[2,1.0,0,0,0,0,0,[],null,[]]",  # a newer version
    "[1,1.0,0,0,0,0,0,[[\"X\",1.0]],null,[]]",  # unknown event kind
    "[1,\"soon\",0,0,0,0,0,[],null,[]]",  # wrong type
    "[1,1.0,-1,0,0,0,0,[],null,[]]",  # negative count
    "[1,1e999,0,0,0,0,0,[],null,[]]",  # not finite
    "[1,1.0,0,0,0,0,0,[],[1.0],[]]",  # truncated interval
    "[" * 100000,  # deep
    "{}", "", "null", "[1]",
])
def test_engine_payload_garbage_reads_as_none(value):
    assert payload.decode(value) is None


def _record(headers):
    rec = RequestRecord("req-1", "cmpl-1", arrival=100.0)
    rec.trace_headers, rec.streaming = headers, True
    rec.flush = FirstChunk()
    rec.flush.first = 100.031  # the first chunk written to the client
    rec.model, rec.prompt_len, rec.out_tokens = "tiny", 12, 4
    rec.queued = 100.004
    rec.schedule = [(SCHEDULED, 100.010)]
    rec.first_tok, rec.recv, rec.second_tok = 100.030, 100.0305, 100.040
    rec.engine = EnginePayload(99.0, waiting=3, running=4, free=10, total=40, attempts=3,
                               adapter=(100.012, 100.020))
    rec.lora = type("Lora", (), {"lora_name": "ad", "lora_int_id": 1})()
    return rec


def test_request_tree_through_the_sdk(telemetry):
    exporter, _, _ = telemetry()
    trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    rec = _record({"traceparent": f"00-{trace_id}-{span_id}-01"})
    api_part().emitter.emit(rec, now=100.2)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    req = spans[semconv.SPAN_REQUEST]
    assert format(req.context.trace_id, "032x") == trace_id
    assert format(req.parent.span_id, "016x") == span_id
    assert req.start_time == clock.monotonic_to_epoch_ns(100.0)
    assert req.end_time == clock.monotonic_to_epoch_ns(100.2)
    attrs = req.attributes
    assert attrs[semconv.ATTR_REQUEST_TTFT] == pytest.approx(0.031)
    assert attrs[semconv.ATTR_REQUEST_ADMISSION_FAILED] == 2
    assert attrs[semconv.ATTR_REQUEST_ARRIVAL_KV_USAGE] == pytest.approx(0.75)
    assert attrs[semconv.ATTR_LORA_LOAD_SECONDS] == pytest.approx(0.008)
    assert attrs[semconv.ATTR_REQUEST_COLD] is True
    kids = [s for s in exporter.get_finished_spans() if s.parent is not None
            and s.parent.span_id == req.context.span_id]
    names = [s.name for s in sorted(kids, key=lambda s: s.start_time)]
    assert names == [semconv.SPAN_REQUEST_INPUT, semconv.SPAN_REQUEST_QUEUE,
                     semconv.SPAN_REQUEST_PREFILL, semconv.SPAN_REQUEST_OUTPUT,
                     semconv.SPAN_REQUEST_FIRST_DECODE]
    tiles = [s for s in kids if s.name != semconv.SPAN_REQUEST_FIRST_DECODE]
    assert sum(s.end_time - s.start_time for s in tiles) == \
        clock.monotonic_to_epoch_ns(100.031) - clock.monotonic_to_epoch_ns(100.0)
    load = spans[semconv.SPAN_ADAPTER_LOAD]
    assert load.parent.span_id == spans[semconv.SPAN_REQUEST_PREFILL].context.span_id
    assert load.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_ADAPTER
    assert all(s.context.trace_id == req.context.trace_id for s in kids)
    assert all(s.resource is req.resource for s in kids)


def test_request_without_a_caller_is_a_root_server_span(telemetry):
    exporter, _, _ = telemetry()
    api_part().emitter.emit(_record(None), now=100.2)
    (req,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
    assert req.parent is None
    assert req.kind.name == "SERVER"


@pytest.mark.parametrize("prefix", [[0, "AAAAAAAAAAA="], [128, "AAAA"], "x", [128]])
def test_engine_payload_refuses_block_digests_it_cannot_read(prefix):
    value = json.loads(payload.encode(EnginePayload(1.0, 0, 0, 1, 2)))
    value[13] = prefix  # no tokens per block, not whole 8-byte digests, not a pair
    assert payload.decode(json.dumps(value)) is None
