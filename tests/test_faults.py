"""Failures without vLLM: an unreachable or silent collector at exit, open spans of a hang, a child
killed while it loads. Real SDK exporters and real processes; the vLLM versions of these are in
test_faults_vllm.py."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, inflight, state_files
from otel_ttft.runtime import environment_variables as env
from otel_ttft.runtime.hooks import fault
from otel_ttft.runtime.state import PartSpec, ProcessIdentity, ProcessState
from otel_ttft.runtime.telemetry import spans
from otel_ttft.tools.analysis.traces import build_trees
from otel_ttft.tools.replay.server import free_port
from otel_ttft.tools.sink.otlp_decode import decode_trace_request
from tests.collector_faults import SilentCollector
from tests.otel_memory import memory_exporter
from tests.request_engine import current_config, our_tracer

WORKER = ProcessIdentity(kind=semconv.PROCESS_WORKER)  # the process these tests' spans claim

EXIT_SCRIPT = textwrap.dedent('''
    import os, sys, time
    from opentelemetry import metrics, trace

    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1],
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                       "OTEL_METRIC_EXPORT_INTERVAL": "60000"})
    from otel_ttft.runtime import configurator
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
    configurator.configure()  # what opentelemetry-instrument runs, then the instrumentors
    VllmTTFTInstrumentor().instrument(skip_dep_check=True)
    tracer = trace.get_tracer("t")
    for i in range(3000):  # more than the SDK's queue (2048): the overflow is counted too
        tracer.start_span(f"s{i}").end()
    metrics.get_meter("t").create_counter("c").add(1)
    print("ready", flush=True)
''')


@pytest.mark.parametrize("collector", ["dead", "silent"])
def test_exit_is_bounded_and_drops_are_counted_once(collector, tmp_path):
    """Unbounded, the SDK waits 10 s per batch against a silent collector (30 s and more here);
    the generous bound below only asks that the exit ended at all."""
    with SilentCollector() as silent:
        endpoint = silent.endpoint if collector == "silent" else f"http://127.0.0.1:{free_port()}"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, endpoint], capture_output=True,
                              text=True, timeout=25, env={**os.environ, "PYTHONPATH": os.getcwd()})
        elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stdout
    lines = proc.stderr.splitlines()
    first = [line for line in lines if "not reaching the collector" in line]
    summary = [line for line in lines if "of final flush; not delivered" in line]
    assert len(first) == 1 and len(summary) == 1, proc.stderr
    # Where the SDK retries a refused send (newer releases), the queue (room for 2560) overflows
    # and the rest waits for the deadline; where it gives up at once, every batch fails.
    reasons = set(re.findall(r"\d+ spans \((\w+)\)", summary[0]))
    assert reasons and reasons <= {"queue_full", "exit_deadline", "export_failed"}, summary[0]
    # Nothing reached the collector: each of the 3000 spans is counted, and only once.
    assert sum(int(n) for n in re.findall(r"(\d+) spans \(", summary[0])) == 3000, summary[0]
    assert "metrics (" in summary[0]  # the metric exporter is bounded and counted too
    # Each SDK message at most once per exporter, traces and metrics (the SDK alone logs one per
    # failed attempt of every batch).
    sdk = Counter(line for line in lines if "otel-ttft" not in line and line.strip())
    assert max(sdk.values(), default=0) <= 2, sdk
    print(f"{collector}: exit after {elapsed:.1f} s; {summary[0]}")


def _stage_spans():
    memory_exporter()  # our configurator's provider: the tracker is on it
    return inflight.tracker()


def test_open_spans_nest_in_opening_order_whatever_their_start_times():
    """A start may come from elsewhere (the process's exec, a parent's clock before a wall-clock
    step): the outermost span is the one opened first, the innermost the one opened last."""
    tracker = _stage_spans()
    ahead = clock.now_ns() + 4_000_000_000
    root = our_tracer().start_span(semconv.SPAN_ACTIVATION, start_time=ahead)
    try:
        with trace.use_span(root), \
                spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ,
                                 tracer=our_tracer(), identity=WORKER) as shard:
            assert [s.name for s in tracker.open_spans()] == [
                semconv.SPAN_ACTIVATION, semconv.SPAN_SHARD_READ]
            assert tracker.innermost() is shard
    finally:
        root.end(end_time=ahead)
    assert tracker.open_spans() == []


def test_open_spans_give_the_in_progress_stage_and_an_unfinished_snapshot():
    exporter = memory_exporter()
    tracker = _stage_spans()
    exporter.clear()
    tracer = our_tracer()
    root = tracer.start_span(semconv.SPAN_ACTIVATION, start_time=clock.now_ns())
    try:
        with trace.use_span(root), \
                spans.stage_span("Load weights", semconv.STAGE_LOAD, tracer=our_tracer(),
                                 identity=WORKER), \
                spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ,
                                 tracer=our_tracer(), identity=WORKER) as shard:
            assert tracker.innermost() is shard
            watch = inflight.InflightWatch.__new__(inflight.InflightWatch)  # its gauge alone
            watch.tracker, watch.identity = tracker, WORKER
            (obs,) = watch.observe()
            assert obs.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD_READ
            assert obs.value >= 0
            published = state_files.read_open_chain(os.getpid())
            assert [c["name"] for c in published["open"]] == [
                semconv.SPAN_ACTIVATION, "Load weights", semconv.SPAN_SHARD_READ]
            assert inflight.export_snapshot() == 3
            copies = exporter.get_finished_spans()
            assert {s.name for s in copies} == {semconv.SPAN_ACTIVATION, "Load weights",
                                                semconv.SPAN_SHARD_READ}
            assert all(s.attributes[semconv.ATTR_SPAN_UNFINISHED] is True for s in copies)
    finally:
        root.end(end_time=clock.now_ns())
    assert watch.observe() == []
    assert state_files.read_open_chain(os.getpid()) is None
    # The real spans came after their copies: a store that keeps the last copy shows them done.
    finished = [_as_dict(s) for s in exporter.get_finished_spans()]
    (tree,) = build_trees(finished).values()
    assert all(semconv.ATTR_SPAN_UNFINISHED not in n.attributes for n in tree[0].walk())


def test_open_spans_end_with_an_error_and_name_the_failed_stage():
    exporter = memory_exporter()
    _stage_spans()
    exporter.clear()
    root = our_tracer().start_span(semconv.SPAN_ACTIVATION, start_time=clock.now_ns())
    token = trace.use_span(root)
    token.__enter__()
    try:
        kv = our_tracer().start_span(
            semconv.SPAN_KV_ALLOC, start_time=clock.now_ns(),
            attributes={semconv.ATTR_STAGE: semconv.STAGE_WARMUP_KV_ALLOC})
        assert inflight.end_open_spans("process received SIGTERM", "SIGTERM") == 2
    finally:
        token.__exit__(None, None, None)
        inflight.end_open_spans("test over", "test")  # none left open for the next test
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name[semconv.SPAN_KV_ALLOC].status.status_code is StatusCode.ERROR
    got = by_name[semconv.SPAN_ACTIVATION]
    assert got.attributes[semconv.ATTR_ACTIVATION_READY] is False
    assert got.attributes[semconv.ATTR_ACTIVATION_FAILED_STAGE] == semconv.STAGE_WARMUP_KV_ALLOC
    assert got.attributes[semconv.ATTR_SPAN_ENDED_BY] == "SIGTERM"
    failure = state_files.take_failure(kv.get_span_context().trace_id)
    assert failure["stage"] == semconv.STAGE_WARMUP_KV_ALLOC
    assert state_files.take_failure(kv.get_span_context().trace_id) is None  # read once


def _child_loads_forever(parent_traceparent: str) -> None:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from otel_ttft.runtime import configurator

    configurator.configure({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    ctx = TraceContextTextMapPropagator().extract({"traceparent": parent_traceparent})
    with spans.stage_span("Load weights", semconv.STAGE_LOAD, context=ctx, tracer=our_tracer(),
                          identity=WORKER), \
            spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ, tracer=our_tracer(),
                             identity=WORKER):
        time.sleep(600)


def test_a_child_killed_while_loading_is_reported_by_its_parent():
    exporter = memory_exporter()
    _stage_spans()
    exporter.clear()
    with our_tracer().start_as_current_span("Executor init") as parent:
        carrier: dict[str, str] = {}
        from opentelemetry.propagate import inject

        inject(carrier)
        child = multiprocessing.get_context("spawn").Process(
            target=_child_loads_forever, args=(carrier["traceparent"],))
        child.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                state = state_files.read_open_chain(child.pid)
                if state and len(state["open"]) == 2:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the child never published its open spans")
            os.kill(child.pid, signal.SIGKILL)
            assert fault.report_dead_children([child], "worker", current_config()) == 1
        finally:
            child.kill()
            child.join(10)
        trace_id = parent.get_span_context().trace_id
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    shard = by_name[semconv.SPAN_SHARD_READ]
    assert shard.status.status_code is StatusCode.ERROR
    assert "SIGKILL" in shard.status.description
    assert shard.attributes[semconv.ATTR_SPAN_ENDED_BY] == "parent"
    assert shard.parent.span_id == by_name["Load weights"].context.span_id
    assert by_name["Load weights"].parent.span_id == parent.get_span_context().span_id
    got = by_name["Executor init"]
    (event,) = [e for e in got.events if e.name == semconv.EVENT_CHILD_DIED]
    assert event.attributes[semconv.ATTR_CHILD_SIGNAL] == "SIGKILL"
    assert event.attributes[semconv.ATTR_CHILD_STAGE] == semconv.STAGE_LOAD_READ
    assert event.attributes[semconv.ATTR_CHILD_PID] == child.pid
    assert got.status.status_code is StatusCode.ERROR
    assert state_files.take_failure(trace_id)["stage"] == semconv.STAGE_LOAD_READ
    assert state_files.read_open_chain(child.pid) is None, "the parent removes the child's file"


def _as_dict(span) -> dict:
    """An SDK span as the store keeps it, through the real OTLP encoder and our decoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    (decoded,) = decode_trace_request(encode_spans([span]))
    return decoded


@pytest.mark.parametrize(("name", "field", "scale", "default"), [
    (env.OTEL_TTFT_SNAPSHOT_AFTER_S, "snapshot_after_s", 1, env.DEFAULT_SNAPSHOT_AFTER_S),
    (env.OTEL_TTFT_EXIT_TIMEOUT_MS, "exit_timeout_s", 1000, env.DEFAULT_EXIT_TIMEOUT_MS),
])
def test_exit_and_snapshot_deadlines_are_read_into_the_config_with_a_fallback(
        name, field, scale, default, caplog):
    def read(raw: str) -> float:
        return getattr(config.Config.from_env({name: raw}), field) * scale

    assert read("2.5") == 2.5
    assert read("") == read("  ") == default
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        assert read("soon") == read("nan") == default
    assert sum(name in r.getMessage() for r in caplog.records) == 2
    assert read("-3") == 0
    if field == "exit_timeout_s":
        assert math.isfinite(read("inf"))  # a deadline: never an endless wait at exit


SIGNAL_SCRIPT = textwrap.dedent('''
    import os, signal, sys
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    os.environ.update({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sys.argv[1] + "/v1/traces",
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                       "OTEL_METRICS_EXPORTER": "none"})
    from otel_ttft import semconv
    from otel_ttft.runtime import configurator
    from otel_ttft.runtime.telemetry import spans
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
    from otel_ttft.runtime.state import ProcessIdentity
    configurator.configure()
    VllmTTFTInstrumentor().instrument(skip_dep_check=True)  # the watchers start with it
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "no handler installed"
    tracer = trace.get_tracer("otel_ttft")
    root = tracer.start_span(semconv.SPAN_ACTIVATION)
    with trace.use_span(root), spans.stage_span("Load weights", semconv.STAGE_LOAD,
                                                tracer=tracer, identity=ProcessIdentity()):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
''')


def test_sigterm_without_a_handler_ends_and_flushes_open_spans(receiver):
    """The default action would kill the process with its spans; ours ends them, flushes, and
    then dies of the same signal."""
    proc = subprocess.run([sys.executable, "-c", SIGNAL_SCRIPT, receiver.http_endpoint],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    spans_ = receiver.wait_for_spans(lambda s: len(s) >= 2, 10)
    by_name = {s["name"]: s for s in spans_}
    for name in (semconv.SPAN_ACTIVATION, "Load weights"):
        assert by_name[name]["status"]["code"] == "ERROR"
        assert by_name[name]["attributes"][semconv.ATTR_SPAN_ENDED_BY] == "SIGTERM"
    root = by_name[semconv.SPAN_ACTIVATION]["attributes"]
    assert root[semconv.ATTR_ACTIVATION_READY] is False
    assert root[semconv.ATTR_ACTIVATION_FAILED_STAGE] == semconv.STAGE_LOAD


def test_an_installed_sigterm_handler_is_left_alone():
    script = textwrap.dedent('''
        import signal
        def mine(*_): pass
        signal.signal(signal.SIGTERM, mine)
        from otel_ttft.runtime import configurator
        configurator.configure({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
        assert signal.getsignal(signal.SIGTERM) is mine
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr


FLAPPING_SCRIPT = textwrap.dedent('''
    import os, sys, time
    from opentelemetry import trace

    endpoint, seconds = sys.argv[1], float(sys.argv[2])
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                       "OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_BSP_SCHEDULE_DELAY": "100",
                       "OTEL_METRIC_EXPORT_INTERVAL": "300"})
    from otel_ttft.runtime import configurator
    configurator.configure()
    tracer = trace.get_tracer("t")
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:  # bounded: a burst every 50 ms for `seconds`
        for _ in range(200):
            tracer.start_span(f"s{i}").end()
            i += 1
        time.sleep(0.05)
    print(i, flush=True)
''')


def test_flapping_collector_drops_are_counted_and_reported_when_it_is_back(tmp_path):
    from tests.collector_faults import FlappingCollector

    with FlappingCollector(tmp_path / "store", up_s=1.5, down_s=1.5) as collector:
        proc = subprocess.run([sys.executable, "-c", FLAPPING_SCRIPT, collector.endpoint, "8"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert proc.returncode == 0, proc.stderr
        assert collector.cycles >= 2, "the collector never went down"
    created = int(proc.stdout.split()[0])
    received = len(collector.store.spans())
    assert 0 < received < created  # some batches arrived in up periods, others were dropped
    dropped = [p for p in collector.store.metric_points()
               if p["name"] == semconv.METRIC_TELEMETRY_DROPPED]
    assert dropped, "the drop counter reached the collector in an up period"
    reasons = {p["attributes"][semconv.ATTR_TELEMETRY_DROP_REASON] for p in dropped}
    assert reasons <= {semconv.DROP_QUEUE_FULL, semconv.DROP_EXPORT_FAILED,
                       semconv.DROP_EXIT_DEADLINE}
    assert {p["attributes"][semconv.ATTR_TELEMETRY_SIGNAL] for p in dropped} <= {"spans",
                                                                                 "metrics"}
    assert max(p["value"] for p in dropped) > 0
    assert "not delivered" in proc.stderr


def test_state_files_left_by_killed_process_trees_are_removed_after_a_day(tmp_path, monkeypatch):
    monkeypatch.setattr(state_files, "state_dir", lambda: tmp_path)
    old = tmp_path / "otel-ttft-open-999999.json"
    fresh = tmp_path / "otel-ttft-failed-0123.json"
    other = tmp_path / "otel-ttft-1-wake_up.json"  # handoff's, not ours
    for path in (old, fresh, other):
        path.write_text("{}")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    os.utime(other, (two_days_ago, two_days_ago))
    state_files.remove_stale()
    assert not old.exists() and fresh.exists() and other.exists()


def test_a_sampler_that_drops_every_span_leaves_stages_and_compiles_running(monkeypatch):
    """``OTEL_TRACES_SAMPLER=always_off`` (or a low ratio): our stage spans are non-recording.
    Nothing of ours may fail on them: a failure inside vLLM's own ``with monitor_torch_compile``
    once stopped the worker, and with it vLLM's start."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from otel_ttft.runtime.hooks import warmup

    _stage_spans()  # the in-flight tracker listens for stages
    dropping = TracerProvider(sampler=ALWAYS_OFF)
    try:
        with spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ,
                              tracer=dropping.get_tracer("t"), identity=WORKER) as span:
            assert not span.is_recording()
        entered = []

        class Compile:  # vLLM's monitor_torch_compile, as the hook hands it over
            def __enter__(self):
                entered.append("enter")

            def __exit__(self, *exc):
                entered.append("exit")

        part = warmup.Warmup(ProcessState(config.Config(tracer_provider=dropping)))
        with warmup._traced_compile(part, Compile(), None, aot_probe=False):
            entered.append("compiling")
        assert entered == ["enter", "compiling", "exit"]
        assert not warmup.COMPILE.failed

        def broken(*args, **kwargs):  # ours fails before the compile: it still runs, once
            raise RuntimeError("ours")

        monkeypatch.setattr(spans, "stage_span", broken)
        entered.clear()
        with warmup._traced_compile(part, Compile(), None, aot_probe=False):
            entered.append("compiling")
        assert entered == ["enter", "compiling", "exit"]
        assert warmup.COMPILE.failed
    finally:
        warmup.COMPILE.failed = False


def test_a_stage_given_after_the_span_opened_is_in_the_published_chain():
    """A shard read opens, then gets its stage (``tag_span``): while instrumented the in-flight
    watch hears it, and a parent that finds the child dead reads the stage it died in."""
    tracker = _stage_spans()
    state = ProcessState(current_config(), [PartSpec(inflight.PART, inflight.InflightWatch)])
    span = our_tracer().start_span(semconv.SPAN_SHARD_READ, start_time=clock.now_ns())
    try:
        assert span in tracker.open_spans()
        spans.tag_span(span, semconv.STAGE_LOAD_READ, None, WORKER)
        (entry,) = state_files.read_open_chain(os.getpid())["open"]
        assert entry["stage"] == semconv.STAGE_LOAD_READ
    finally:
        span.end()
        state.close()
    assert spans._stage_listeners == []
