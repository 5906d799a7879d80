"""scripts/gpu-check's judgement on CPU: what it asks of the spans of a GPU vLLM (synthetic here,
shaped as the receiver stores them), that it names each missing piece, and that a server that does
not start is one FAIL line. The real run needs an NVIDIA machine (docs/gpu-checks.md)."""

from __future__ import annotations

import itertools

import pytest

from otel_ttft import semconv
from otel_ttft.tools.replay.server import ServerStartError
from scripts import gpu_check

_ids = itertools.count(1)


def _span(name, start, end, parent=None, trace="t1", **attributes):
    return {"trace_id": trace, "span_id": f"s{next(_ids)}",
            "parent_span_id": parent["span_id"] if parent else None, "name": name,
            "start_ns": start, "end_ns": end, "attributes": attributes}


def _gpu_run():
    """A start activation covering its time, graphs and H2D on it, a sleep, a wake-up."""
    start = _span(semconv.SPAN_ACTIVATION, 0, 100, **{semconv.ATTR_ACTIVATION_KIND: "start"})
    spans = [
        start,
        _span(semconv.SPAN_DEVICE_INIT, 0, 10, start),
        _span(semconv.SPAN_LOAD_WEIGHTS, 10, 60, start, **{semconv.ATTR_H2D_BYTES: 4096}),
        _span("Capture model", 60, 100, start,
              **{semconv.ATTR_GRAPH_COUNT: 10,
                 semconv.ATTR_STAGE: semconv.STAGE_WARMUP_GRAPH_CAPTURE}),
        _span(semconv.SPAN_SLEEP, 200, 210, trace="t2"),
    ]
    wake = _span(semconv.SPAN_ACTIVATION, 300, 400, trace="t3",
                 **{semconv.ATTR_ACTIVATION_KIND: "wake"})
    spans += [wake, _span(semconv.SPAN_WAKE_UP, 300, 390, wake, trace="t3",
                          **{semconv.ATTR_STAGE: semconv.STAGE_LOAD_H2D})]
    return spans


def _without(spans, name):
    return [s for s in spans if s["name"] != name]


def test_a_complete_gpu_run_passes():
    assert gpu_check.check(_gpu_run()) == []


@pytest.mark.parametrize(("change", "problem"), [
    (lambda s: _without(s, "Capture model"), "no 'Capture model' span with ttft.graph.count > 0"),
    (lambda s: _without(s, semconv.SPAN_LOAD_WEIGHTS), "no host-to-device bytes"),
    (lambda s: _without(s, semconv.SPAN_DEVICE_INIT), "no 'Init device' span"),
    (lambda s: _without(s, semconv.SPAN_SLEEP), "no 'Sleep' span"),
    (lambda s: _without(s, semconv.SPAN_WAKE_UP), "wake-up activation has no 'Wake up'"),
    (lambda s: [x for x in s if x["trace_id"] != "t3"], "no wake-up activation"),
    (lambda s: [x for x in s if x["trace_id"] != "t1"], "expected one start activation, got 0"),
])
def test_each_missing_gpu_path_is_named(change, problem):
    found = gpu_check.check(change(_gpu_run()))
    assert any(problem in p for p in found), found


def test_a_start_activation_with_a_gap_fails_coverage():
    spans = [s for s in _gpu_run() if s["name"] != semconv.SPAN_DEVICE_INIT]
    spans.append(_span(semconv.SPAN_DEVICE_INIT, 0, 1, spans[0]))  # 9% of the start uncovered
    assert any("coverage 0.91 < 0.95" in p for p in gpu_check.check(spans))


def _replay_run():
    spans = []
    for scenario in gpu_check.REPLAY_SCENARIOS:
        request = _span(semconv.SPAN_REPLAY_REQUEST, 0, 10, trace=scenario,
                        **{semconv.ATTR_REPLAY_SCENARIO: scenario})
        spans += [request, _span(semconv.SPAN_REQUEST, 1, 9, request, trace=scenario)]
    for i in range(2):
        switch = _span(semconv.SPAN_SWITCH, 20, 30, trace=f"sw{i}",
                       **{semconv.ATTR_SWITCH_REASON: semconv.SWITCH_REASON_SLEEP})
        wake = _span(semconv.SPAN_ACTIVATION, 30, 40, trace=f"wk{i}",
                     **{semconv.ATTR_ACTIVATION_KIND: "wake"})
        spans += [switch, _span(semconv.SPAN_SLEEP, 21, 29, switch, trace=f"sw{i}"), wake]
    return spans


def test_the_sleep_driver_replay_is_judged_end_to_end():
    assert gpu_check.check_sleep_replay(_replay_run()) == []
    lost = [s for s in _replay_run() if s["name"] != semconv.SPAN_REQUEST]
    assert any("traceparent lost" in p for p in gpu_check.check_sleep_replay(lost))
    orphan_sleep = [{**s, "parent_span_id": None} if s["name"] == semconv.SPAN_SLEEP else s
                    for s in _replay_run()]
    assert any("not under the API's vllm.switch" in p
               for p in gpu_check.check_sleep_replay(orphan_sleep))
    failed = [{**s, "attributes": {**s["attributes"], semconv.ATTR_REPLAY_ERROR: "HTTP 500"}}
              if s["name"] == semconv.SPAN_REPLAY_REQUEST else s for s in _replay_run()]
    assert "replay: a request failed" in gpu_check.check_sleep_replay(failed)


def test_a_server_that_does_not_start_is_one_fail_line():
    def boom():
        raise ServerStartError("vLLM exited with 1\nlog tail ...")

    assert gpu_check.guarded("sleep/wake", boom) == [
        "sleep/wake: ServerStartError: vLLM exited with 1"]
    assert gpu_check.guarded("replay", lambda: ["x"]) == ["x"]
    with pytest.raises(ValueError):  # a bug of ours is not swallowed
        gpu_check.guarded("replay", lambda: int("x"))


def test_without_a_gpu_it_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "_has_gpu", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no NVIDIA GPU" in capsys.readouterr().err


def _runner_start(runner):
    named = {semconv.ATTR_MODEL_RUNNER: runner}
    return [
        _span("Capture model", 0, 10, **{semconv.ATTR_STAGE: semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                                         semconv.ATTR_GRAPH_COUNT: 35,
                                         semconv.ATTR_GRAPH_FULL_COUNT: 5,
                                         semconv.ATTR_GRAPH_PIECEWISE_COUNT: 6,
                                         semconv.ATTR_GRAPH_PIECEWISE_PIECES: 30,
                                         semconv.ATTR_GRAPH_MEMORY_BYTES: 1 << 20, **named}),
        _span(semconv.SPAN_KV_ALLOC, 10, 20, **{semconv.ATTR_STAGE: semconv.STAGE_WARMUP_KV_ALLOC,
                                                semconv.ATTR_KV_BLOCKS: 1000,
                                                semconv.ATTR_KV_BYTES: 1 << 30, **named}),
    ]


def test_each_runner_needs_both_graph_modes_counted_apart():
    runner = gpu_check.RUNNERS["1"]
    spans = _runner_start(runner)
    old = dict(spans[0]["attributes"])  # before issue 55: one count, no modes
    for key in (semconv.ATTR_GRAPH_FULL_COUNT, semconv.ATTR_GRAPH_PIECEWISE_COUNT,
                semconv.ATTR_GRAPH_PIECEWISE_PIECES):
        old.pop(key)
    spans[0] = {**spans[0], "attributes": old}
    (problem,) = gpu_check.check_runner(spans, runner)
    assert "counts full 0, piecewise 0 sizes in 0 pieces" in problem


@pytest.mark.parametrize("flag", sorted(gpu_check.RUNNERS))
def test_each_runner_needs_its_graph_capture_and_kv_spans_with_numbers(flag):
    runner = gpu_check.RUNNERS[flag]
    label = "V2" if flag == "1" else "V1"
    assert gpu_check.check_runner(_runner_start(runner), runner) == []
    other = gpu_check.RUNNERS["0" if flag == "1" else "1"]
    assert gpu_check.check_runner(_runner_start(other), runner) == [
        f"{label}: 'Capture model' names runner {other!r}, not {runner}",
        f"{label}: 'Allocate KV cache' names runner {other!r}, not {runner}"]
    no_graphs = _runner_start(runner)
    no_graphs[0]["attributes"][semconv.ATTR_GRAPH_COUNT] = 0
    assert gpu_check.check_runner(no_graphs, runner) == [
        f"{label}: 'Capture model' has no {semconv.ATTR_GRAPH_COUNT} > 0"]
    assert gpu_check.check_runner(_runner_start(runner)[1:], runner) == [
        f"{label}: expected one 'Capture model' [warmup.graph_capture] span, got 0"]


_EXECUTION = {"PIECEWISE": semconv.EXECUTION_PIECEWISE_GRAPH,
              "FULL": semconv.EXECUTION_FULL_GRAPH, "NONE": semconv.EXECUTION_COMPILED}


def _first_use_run(short_mode="PIECEWISE", long_mode="NONE", compiled="triton",
                   again_paid=False, long_execution=None):
    from scripts import gpu_check_first_use as first_use

    def request(trace, **attrs):
        return _span(semconv.SPAN_REQUEST, 0, 10, trace=trace, **attrs)

    spans = [request("short", **{semconv.ATTR_STEP_CUDAGRAPH_MODE: short_mode,
                                 semconv.ATTR_STEP_EXECUTION: _EXECUTION[short_mode]}),
             request("long", **{semconv.ATTR_STEP_CUDAGRAPH_MODE: long_mode,
                                semconv.ATTR_STEP_EXECUTION:
                                    long_execution or _EXECUTION[long_mode],
                                semconv.ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS: 16}),
             request("logprobs", **{semconv.ATTR_REQUEST_COMPILE_SECONDS: 2.0}),
             request("again", **({semconv.ATTR_REQUEST_COMPILE_SECONDS: 0.1} if again_paid
                                 else {}))]
    frames = {"triton": "logprob.py:_topk_log_softmax_kernel",  # V2: Triton's hooks
              "dynamo": "logprobs.py:batched_count_greater_than",  # V1: Dynamo's callbacks
              "triton-elsewhere": "penalties.py:_penalties_kernel"}
    if compiled:
        spans.append(_span(semconv.SPAN_TORCH_COMPILE, 2, 4, spans[2], trace="logprobs", **{
            semconv.ATTR_STAGE: semconv.STAGE_WARMUP_STEP_COMPILE,
            semconv.ATTR_COMPILE_COMPILER: compiled.partition("-")[0],
            semconv.ATTR_COMPILE_FRAME: frames[compiled]}))
    return first_use.check(spans, "short", "long", "logprobs", "again")


@pytest.mark.parametrize("compiled", ["triton", "dynamo"])
def test_gpu_check_first_use_passes_what_a_gpu_should_show(compiled):
    assert _first_use_run(compiled=compiled) == []


@pytest.mark.parametrize("run, says", [
    (dict(short_mode="NONE"), "a 5-token prefill ran 'compiled'"),
    (dict(long_mode="PIECEWISE"), "a 100-token prefill"),
    (dict(long_execution=semconv.EXECUTION_EAGER), "the compiled model"),
    (dict(compiled=None), "no warmup.step_compile"),
    (dict(compiled="triton-elsewhere"), "no warmup.step_compile"),
    (dict(again_paid=True), "the second logprobs request paid a compile too"),
])
def test_gpu_check_first_use_names_what_is_missing(run, says):
    (problem,) = _first_use_run(**run)
    assert says in problem
