"""The live verdict: the rule on activation records (no baseline, thin, measured, cold requests),
its sentence, the thresholds shared with the alert rules, and the runtime judging an activation
from real SDK spans of a real vLLM config, with its history file, span attributes, child span
after the cold requests, log line and gauge."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import yaml

from otel_ttft import semconv
from otel_ttft.diagnosis import activation as diagnosis
from otel_ttft.diagnosis import thresholds
from tests.request_engine import current_config, our_tracer

ROOT = Path(__file__).resolve().parents[1]
STARTUP = {"warmup.process_start": 20.0, "warmup.frontend": 1.0, "load.read": 1.0, "load": 0.5,
           "warmup.compile": 10.0, "warmup.kv_alloc": 0.1, "warmup": 3.0}


def record(i: int, key: str = "k", hit: bool | None = True, **extra: float) -> dict:
    stages = dict(STARTUP)
    for stage, seconds in extra.items():
        stages[stage.replace("__", ".")] = stages.get(stage.replace("__", "."), 0.0) + seconds
    return {"id": f"{i:032x}", "key": key, "model": "tiny", "kind": "start", "at": float(i),
            "duration_s": sum(stages.values()), "stages": stages,
            "evidence": {"compile_cache_hit": hit, "compile_cache_dir": "/tmp/c/torch_compile",
                         "bytes_read": 0}, "facts": {"compile_cache_dir": "/tmp/c/torch_compile"}}


def test_the_thresholds_are_the_alert_rules():
    doc = yaml.safe_load((ROOT / "collector-config/rules/otel-ttft-warmup.yml").read_text())
    records = {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    assert records["otel_ttft:threshold:warmup_regression_factor"] == \
        f"vector({thresholds.WARMUP_REGRESSION_FACTOR:g})"
    assert records["otel_ttft:threshold:warmup_regression_min_seconds"] == \
        f"vector({thresholds.WARMUP_REGRESSION_MIN_SECONDS:g})"


def test_stages_tile_the_activation_most_specific_first():
    s = 1_000_000_000
    intervals = [diagnosis.Interval(0, 10 * s, "warmup"),
                 diagnosis.Interval(2 * s, 6 * s, "load"),
                 diagnosis.Interval(3 * s, 5 * s, "load.read"),
                 diagnosis.Interval(7 * s, 9 * s, "warmup.compile"),
                 diagnosis.Interval(8 * s, 20 * s, "warmup.kv_alloc")]
    out = diagnosis.stage_seconds(intervals, 0, 12 * s)
    # 0-2 warmup, 2-3 load, 3-5 load.read, 5-6 load, 6-7 warmup, 7-8 compile, then KV
    # allocation (began later than the compile it overlaps) to the end
    assert out == pytest.approx({"warmup": 3.0, "load": 2.0, "load.read": 2.0,
                                 "warmup.compile": 1.0, "warmup.kv_alloc": 4.0})
    assert sum(out.values()) == pytest.approx(12.0)


def test_first_activation_says_what_it_measured_and_that_there_is_no_baseline():
    j = diagnosis.judge(record(1), [record(2, key="other")])
    assert (j["outcome"], j["baseline"], j["stage"]) == ("no-baseline", "none", "none")
    assert "no baseline yet" in j["summary"] and "warmup.process_start 20.0 s" in j["summary"]


def test_thin_baseline_names_the_stage_beyond_the_alert_thresholds():
    j = diagnosis.judge(record(9, hit=False, warmup__compile=25.0), [record(1)])
    assert (j["outcome"], j["baseline"], j["stage"], j["substage"]) == (
        "expanded", "thin", "warmup", "warmup.compile")
    assert j["increase_s"] == pytest.approx(25.0)
    assert j["recommendation"] == "persist-artifacts"
    assert j["substage_increase_s"] == pytest.approx(25.0)
    assert "earliest stage that grew: warmup.compile +25.0 s (warmup +25.0 s in all) (the " \
           "compile cache missed, cache under /tmp/c/torch_compile)" in j["summary"]
    assert "thin baseline (1 earlier)" in j["summary"]
    assert "25.0 s more than the last start of this model (35.6 s" in j["summary"]


@pytest.mark.parametrize("extra", [8.0, 9.9])
def test_thin_baseline_below_the_minimum_seconds_is_nothing(extra):
    """x2 of a 10 s compile, but under the alert's 10 s minimum: not a regression."""
    j = diagnosis.judge(record(9, warmup__compile=extra), [record(1)])
    assert (j["outcome"], j["stage"]) == ("within-noise", "none")
    assert "no stage grew beyond the noise" in j["summary"]


def test_measured_baseline_uses_the_noise_of_the_earlier_activations():
    earlier = [record(i, warmup__process_start=d) for i, d in enumerate((0.0, 2.0, -1.5, 1.0))]
    cold_read = record(9, load__read=10.0)
    cold_read["evidence"].update(bytes_read=5_000_000_000, page_cache_resident_ratio=0.0)
    slow = diagnosis.judge(cold_read, earlier)
    assert (slow["outcome"], slow["baseline"], slow["stage"], slow["substage"]) == (
        "expanded", "measured", "load", "load.read")
    assert slow["best_s"] == pytest.approx(35.6 - 1.5)
    assert "checkpoint 0% in the page cache before its reads" in slow["summary"]
    assert "thin baseline" not in slow["summary"]
    same = diagnosis.judge(record(9, warmup__process_start=1.5), earlier)
    assert same["outcome"] == "within-noise"


def test_the_rule_is_the_one_analyze_applies():
    """The same records through the rule analyze calls give the same verdict."""
    from otel_ttft.tools.analysis import verdict as analyze_rule

    earlier = [record(1), record(2, warmup__compile=1.0)]
    current = record(9, hit=False, warmup__compile=30.0)
    live = diagnosis.judge(current, earlier)
    again = analyze_rule.verdict("this start", "the earlier starts", [diagnosis.as_row(current)],
                                 [diagnosis.as_row(r) for r in earlier],
                                 thin=thresholds.ALERT_THRESHOLDS)
    assert live["verdict"] == again


def test_cold_requests_count_their_warm_up_as_warm_up():
    from otel_ttft.runtime.hooks.activation_verdict import _add_request_stages

    into: dict[str, float] = {}
    warmup = [(semconv.SPAN_TORCH_COMPILE, semconv.STAGE_WARMUP_COMPILE, 10.0, 12.0, {}),
              (semconv.SPAN_FIRST_USE, semconv.STAGE_WARMUP_FIRST_USE, 9.0, 9.1, {})]
    _add_request_stages(into, {"frontend": 0.2, "queue": 0.01, "prefill": 2.5,
                               "first_decode": 0.05}, warmup)
    assert into == pytest.approx({"frontend": 0.1, "queue": 0.01, "prefill": 0.5,
                                  "warmup.compile": 2.0, "warmup.first_use": 0.1})
    rec = dict(record(9), cold={"requests": 3, "ttft_s": 2.71, "stages": into})
    j = diagnosis.judge(rec, [dict(record(1), cold={"requests": 3, "ttft_s": 0.1,
                                                    "stages": {"prefill": 0.1}})],
                        phase=semconv.VERDICT_PHASE_COLD_REQUESTS)
    assert j["duration_s"] == pytest.approx(35.6 + 2.71)
    assert "to its cold requests' first tokens" in j["summary"]


def test_cold_requests_that_lost_the_prefix_cache_are_named_with_the_warm_up():
    """Earlier activations' cold requests read 1,000 of their 1,200 prompt tokens from vLLM's
    prefix cache (their servers were warmed by a shared prefix); this one's read none, and its
    cold requests' prefill grew by seconds (a long shared history on a large model; against a
    whole start, tens of milliseconds are noise): the uncached prefix is named, with the
    warm-up."""
    def cold(i, prefill, cached, **extra):
        return dict(record(i, **extra), cold={
            "requests": 3, "ttft_s": 0.05 + prefill, "stages": {"frontend": 0.05,
                                                                  "prefill": prefill},
            "prompt_tokens": 1200, "cached_tokens": cached})

    earlier = [cold(i, 0.6 + 0.01 * i, 1000) for i in range(1, 6)]
    j = diagnosis.judge(cold(9, 7.2, 0), earlier, phase=semconv.VERDICT_PHASE_COLD_REQUESTS)
    assert (j["stage"], j["substage"], j["recommendation"]) == (
        "prefill", semconv.STAGE_PREFILL_UNCACHED_PREFIX, "warm-up"), j["summary"]
    assert j["substage_increase_s"] == pytest.approx(7.2 * 1000 / 1200, abs=1e-3)
    assert (j["evidence"]["cold_cached_tokens"], j["evidence"]["cold_uncached_prefix_tokens"]) \
        == (0, 1000)
    from otel_ttft.runtime.hooks.activation_verdict import attributes

    span = attributes(j)  # what the verdict span carries
    assert (span[semconv.ATTR_VERDICT_COLD_CACHED_TOKENS],
            span[semconv.ATTR_VERDICT_COLD_UNCACHED_PREFIX_TOKENS]) == (0, 1000)
    # the same prefill growth with the cache as full as before: not the prefix cache
    j = diagnosis.judge(cold(9, 7.2, 1000), earlier, phase=semconv.VERDICT_PHASE_COLD_REQUESTS)
    assert j["substage"] != semconv.STAGE_PREFILL_UNCACHED_PREFIX, j["summary"]
    # a record from a file anyone could write: token counts that are not counts are left out
    bad = dict(cold(9, 7.2, 0), cold={"requests": 3, "ttft_s": 7.25, "stages": {
        "prefill": 7.2}, "prompt_tokens": "many", "cached_tokens": -1})
    assert diagnosis.judge(bad, earlier, phase=semconv.VERDICT_PHASE_COLD_REQUESTS)[
        "substage"] != semconv.STAGE_PREFILL_UNCACHED_PREFIX


# --- the runtime, on a real vLLM config and real SDK spans -------------------------------------
@pytest.fixture(scope="module")
def vllm_config(tiny_model):
    """A real ``VllmConfig``. Making one loads vLLM's general plugins, ours among them, which
    instruments this process: undone, so the tests after these find it as it was."""
    from vllm.engine.arg_utils import EngineArgs

    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor

    was = VllmTTFTInstrumentor().is_instrumented_by_opentelemetry
    made = EngineArgs(model=str(tiny_model), enforce_eager=True, dtype="float32",
                      max_model_len=512, kv_cache_memory_bytes=64 << 20).create_engine_config()
    if not was and VllmTTFTInstrumentor().is_instrumented_by_opentelemetry:
        VllmTTFTInstrumentor().uninstrument()
    return made


def _activation(verdict, ledger, spans, vllm_config, compile_s: float):
    """One start as the API server sees it: its config noted, stage spans ended under its root
    (as EngineCore's and the worker's would be), ready."""
    from opentelemetry import trace

    from otel_ttft.runtime import clock
    from otel_ttft.runtime.state import ProcessIdentity

    api_server = ProcessIdentity(kind=semconv.PROCESS_API_SERVER)
    live = _live(verdict)
    live.note_config(vllm_config)
    assert live.wait_for_history(60)
    end = clock.now_ns()
    start = end - int((20 + compile_s) * 1e9)
    root = our_tracer().start_span(semconv.SPAN_ACTIVATION, start_time=start)
    parent = trace.set_span_in_context(root)
    spans.emit_span(semconv.SPAN_PROCESS_START, start, start + int(15e9),
                    stage=semconv.STAGE_WARMUP_PROCESS_START, context=parent,
                    tracer=our_tracer(), identity=api_server)
    spans.emit_span(semconv.SPAN_TORCH_COMPILE, start + int(16e9),
                    start + int((16 + compile_s) * 1e9), stage=semconv.STAGE_WARMUP_COMPILE,
                    context=parent, attributes={semconv.ATTR_COMPILE_CACHE_HIT: False,
                                                semconv.ATTR_COMPILE_CACHE_DIR: "/tmp/cc"},
                    tracer=our_tracer(), identity=api_server)
    live.on_ready(root, start, end)
    root.end(end_time=end)
    return root, live


def _live(verdict):
    """A fresh live-verdict part, as ``_instrument`` makes it in a new process."""
    from otel_ttft.runtime.state import PartSpec, ProcessState

    return ProcessState(current_config(), [PartSpec(verdict.PART, verdict.LiveVerdict)]) \
        .part(verdict.PART)


def _verdict(exporter, root, phase: str) -> object:
    """The activation's child span with its verdict of ``phase``, judged in a thread."""
    def children():
        return [s for s in exporter.get_finished_spans() if s.name ==
                semconv.SPAN_ACTIVATION_VERDICT and s.parent.span_id ==
                root.get_span_context().span_id
                and s.attributes[semconv.ATTR_VERDICT_PHASE] == phase]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not children():
        time.sleep(0.05)
    (child,) = children()
    return child


def _cold_requests(live, exporter, root) -> object:
    """The activation's cold requests, done: its child span with the verdict again."""
    act = type("Act", (), {"span_context": root.get_span_context()})()
    cold = current_config().cold_requests
    for index in range(1, cold + 1):
        live.request_done(act, index, 0.05, {"frontend": 0.01, "prefill": 0.04})
    live.request_done(act, cold + 1, 9.0, {"prefill": 9.0})  # warm
    return _verdict(exporter, root, semconv.VERDICT_PHASE_COLD_REQUESTS)


@pytest.mark.vllm_import
def test_the_runtime_judges_each_start_against_the_last(telemetry, vllm_config, tmp_path,
                                                         monkeypatch, caplog):
    from otel_ttft.runtime import activation_history
    from otel_ttft.runtime.hooks import activation_ledger as ledger
    from otel_ttft.runtime.hooks import activation_verdict as verdict
    from otel_ttft.runtime.telemetry import spans

    exporter, reader, provider = telemetry()
    provider.add_span_processor(ledger.install())  # as our configurator adds it
    path = tmp_path / "history.json"
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(path))
    monkeypatch.setattr(ledger.state_files, "state_dir", lambda: tmp_path)
    caplog.set_level(logging.INFO, logger="vllm.otel_ttft")
    try:
        first, live = _activation(verdict, ledger, spans, vllm_config, compile_s=3.0)
        assert not any(k.startswith("ttft.verdict.") for k in first.attributes)  # ended first
        attrs = dict(_verdict(exporter, first, semconv.VERDICT_PHASE_READY).attributes)
        assert attrs[semconv.ATTR_VERDICT_OUTCOME] == "no-baseline"
        assert attrs[semconv.ATTR_VERDICT_DURATION_S] == pytest.approx(23.0)
        assert "no baseline yet" in caplog.text
        child = _cold_requests(live, exporter, first)
        assert child.attributes[semconv.ATTR_VERDICT_OUTCOME] == "no-baseline"
        assert child.attributes[semconv.ATTR_VERDICT_DURATION_S] == pytest.approx(23.15)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [
                r for r in activation_history.load(path).records if r.get("cold")]:
            time.sleep(0.05)  # saved by a thread
        (saved,) = activation_history.load(path).records
        assert saved["cold"]["requests"] == 3 and saved["duration_s"] == pytest.approx(23.0)

        live.close()
        second, live = _activation(verdict, ledger, spans, vllm_config, compile_s=20.0)
        attrs = dict(_verdict(exporter, second, semconv.VERDICT_PHASE_READY).attributes)
        assert attrs[semconv.ATTR_VERDICT_OUTCOME] == "expanded"
        assert attrs[semconv.ATTR_VERDICT_BASELINE] == "thin"
        assert attrs[semconv.ATTR_VERDICT_SUBSTAGE] == semconv.STAGE_WARMUP_COMPILE
        assert attrs[semconv.ATTR_VERDICT_INCREASE_S] == pytest.approx(17.0, abs=0.01)
        assert attrs[semconv.ATTR_VERDICT_SUBSTAGE_INCREASE_S] == pytest.approx(17.0, abs=0.01)
        change = list(attrs[semconv.ATTR_VERDICT_CHANGE])
        import vllm.envs as envs

        assert change[0].startswith("VLLM_CACHE_ROOT=") and "VLLM_CACHE_ROOT" in \
            envs.environment_variables
        assert "earliest stage that grew: warmup.compile +17.0 s" in caplog.text
        assert "(the compile cache missed, cache under /tmp/cc)" in caplog.text

        # Its cold requests: once the last is done, a child span with the verdict again.
        child = _cold_requests(live, exporter, second)
        assert child.attributes[semconv.ATTR_VERDICT_PHASE] == "cold_requests"
        assert child.attributes[semconv.ATTR_VERDICT_OUTCOME] == "expanded"
        assert child.attributes[semconv.ATTR_VERDICT_SUBSTAGE] == semconv.STAGE_WARMUP_COMPILE
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([
                r for r in activation_history.load(path).records if r.get("cold")]) < 2:
            time.sleep(0.05)  # saved by a thread after the child span
        assert [bool(r.get("cold")) for r in activation_history.load(path).records] == [True, True]

        points = [p for m in reader.get_metrics_data().resource_metrics[0].scope_metrics
                  for metric in m.metrics if metric.name == semconv.METRIC_ACTIVATION_VERDICT
                  for p in metric.data.data_points]
        (point,) = points
        assert point.value == pytest.approx(17.0, abs=0.01)
        assert point.attributes[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP
        assert point.attributes[semconv.ATTR_VERDICT_RECOMMENDATION] == "persist-artifacts"
        assert point.attributes[semconv.ATTR_ACTIVATION_TRACE_ID] == format(
            second.get_span_context().trace_id, "032x")
    finally:
        live.close()


@pytest.mark.vllm_import
def test_switched_off_it_reads_and_writes_nothing(telemetry, vllm_config, tmp_path,
                                                  monkeypatch):
    from otel_ttft.runtime.hooks import activation_ledger as ledger
    from otel_ttft.runtime.hooks import activation_verdict as verdict

    telemetry()
    monkeypatch.setenv("OTEL_TTFT_VERDICT", "false")
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(tmp_path / "h.json"))
    live = _live(verdict)
    live.note_config(vllm_config)
    assert not live.wait_for_history(0)
    root = our_tracer().start_span(semconv.SPAN_ACTIVATION)
    live.on_ready(root, 0, 1)
    root.end()
    assert not any(k.startswith("ttft.verdict.") for k in root.attributes)
    assert not (tmp_path / "h.json").exists()
    assert ledger.install() is None  # our configurator adds no ledger either
