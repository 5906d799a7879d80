"""OTel -> Prometheus names as the Collector's prometheus exporter writes them, and the scrape
endpoint on the embedded store: real OTel SDK metrics from our instruments, over real OTLP to the
embedded receiver, scraped over HTTP and parsed with prometheus_client's OpenMetrics parser."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from otel_ttft import semconv
from otel_ttft.tools.prom import naming
from otel_ttft.tools.prom.exposition import series
from otel_ttft.tools.prom.serve import serve
from otel_ttft.tools.sink.store import SpanStore


@pytest.mark.parametrize(("name", "unit", "mtype", "expected"), [
    # our metrics
    (semconv.METRIC_ACTIVATION_STAGE_DURATION, "s", naming.HISTOGRAM,
     "ttft_activation_stage_duration_seconds"),
    (semconv.METRIC_LOAD_READ_BYTES, "By", naming.COUNTER, "ttft_load_read_bytes_total"),
    (semconv.METRIC_LOAD_READ_THROUGHPUT, "GBy/s", naming.HISTOGRAM,
     "ttft_load_read_throughput_gigabytes_per_second"),
    (semconv.METRIC_SERVER_TTFT, "s", naming.HISTOGRAM,
     "gen_ai_server_time_to_first_token_seconds"),
    (semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, "s", naming.HISTOGRAM,
     "gen_ai_client_operation_time_to_first_chunk_seconds"),
    (semconv.METRIC_REQUEST_STAGE_TIME, "s", naming.COUNTER,
     "ttft_request_stage_time_seconds_total"),
    (semconv.METRIC_REQUEST_ARRIVAL_WAITING, "{request}", naming.GAUGE,
     "ttft_request_arrival_waiting_requests"),
    (semconv.METRIC_REQUEST_ARRIVAL_KV_USAGE, "1", naming.GAUGE,
     "ttft_request_arrival_kv_usage_ratio"),
    (semconv.METRIC_ACTIVATION_STAGE_LAST_DURATION, "s", naming.GAUGE,
     "ttft_activation_stage_last_duration_seconds"),
    (semconv.METRIC_ACTIVATION_COMPILE_CACHE_HIT_RATIO, "1", naming.GAUGE,
     "ttft_activation_compile_cache_hit_ratio"),
    # the translator's own examples
    ("http.server.duration", "s", naming.HISTOGRAM, "http_server_duration_seconds"),
    ("requests.count", "1", naming.COUNTER, "requests_count_total"),
    ("system.io", "By", naming.COUNTER, "system_io_bytes_total"),
    ("memory.usage", "By", naming.GAUGE, "memory_usage_bytes"),
    ("net.rate", "By/s", naming.GAUGE, "net_rate_bytes_per_second"),
    ("jobs.total", "", naming.COUNTER, "jobs_total"),
    ("2xx.count", "", naming.GAUGE, "_2xx_count"),
    ("foo__bar..baz", "ms", naming.GAUGE, "foo_bar_baz_milliseconds"),
    ("cpu.utilization", "1", naming.COUNTER, "cpu_utilization_total"),
    ("queue.size", "{item}/s", naming.GAUGE, "queue_size_per_second"),
])
def test_metric_names_follow_the_collector(name, unit, mtype, expected):
    assert naming.metric_name(name, unit, mtype) == expected


def test_labels_follow_the_collector():
    out = naming.labels({"ttft.stage": "load.read", "ttft.request.cold": True, "1x": 1.0,
                         "_p": "q", "a.b": "x", "a_b": "y"},
                        {"service.name": "vllm", "service.namespace": "lab",
                         "service.instance.id": "i-1", "process.pid": 42}, "otel_ttft")
    assert out["ttft_stage"] == "load.read"
    assert out["ttft_request_cold"] == "true"
    assert out["key_1x"] == "1"
    assert out["key_p"] == "q"
    assert out["a_b"] == "x;y"  # collisions are joined in key order
    assert out["job"] == "lab/vllm" and out["instance"] == "i-1"
    assert out["process_pid"] == "42" and out["service_name"] == "vllm"
    assert out["otel_scope_name"] == "otel_ttft"


def _point(**kw):
    base = {"name": "c", "unit": "", "type": "sum", "is_monotonic": True,
            "temporality": "CUMULATIVE", "attributes": {}, "resource": {"service.name": "s"},
            "scope": "x", "time_ns": 1, "value": 1}
    return base | kw


def test_cumulative_points_replace_and_delta_points_add_up():
    (cum,) = series([_point(time_ns=1, value=5), _point(time_ns=2, value=7)])
    assert cum.points[-1]["value"] == 7
    (delta,) = series([_point(temporality="DELTA", time_ns=1, value=5),
                       _point(temporality="DELTA", time_ns=2, value=7)])
    assert delta.points[-1]["value"] == 12
    (history,) = series([_point(time_ns=1, value=5), _point(time_ns=2, value=7)], history=True)
    assert [p["value"] for p in history.points] == [5, 7]


EMIT = r'''
import sys
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

endpoint = sys.argv[1]
resource = Resource.create({"service.name": "vllm-x", "service.instance.id": "proc-1"})
reader = PeriodicExportingMetricReader(OTLPMetricExporter(f"{endpoint}/v1/metrics"),
                                       export_interval_millis=60000)
provider = MeterProvider(metric_readers=[reader], resource=resource)
metrics.set_meter_provider(provider)
trace.set_tracer_provider(TracerProvider(resource=resource))

from otel_ttft.runtime import config
from otel_ttft.runtime.state import PartSpec, ProcessState
from otel_ttft.runtime.telemetry import metrics as stage_metrics
from otel_ttft.runtime.hooks.request import metrics as mr

m = ProcessState(config.Config(), [PartSpec(stage_metrics.PART, stage_metrics.StageMetrics)]
                 ).part(stage_metrics.PART)
m.record_activation_stage("warmup.compile", 2.5, "tiny", 1, cache_hit=True)
m.record_activation_stage("warmup.compile", 4.0, "tiny", 1, cache_hit=False)
m.record_activation_stage("load.read", 0.75, "tiny", 1)
m.record_shard_read(1000, 1.5, "tiny")
with trace.get_tracer("t").start_as_current_span("llm_request") as span:
    mr.RequestMetrics(config.Config(), metrics.get_meter("otel_ttft")).record(
        0.03, {"queue": 0.01, "prefill": 0.02}, "tiny", True, 2, 0.25)
    print(format(span.get_span_context().trace_id, "032x"))
provider.shutdown()  # one export: like the Collector, a later point without exemplars would
                    # replace this one
'''


def _scrape(url: str) -> str:
    req = urllib.request.Request(url, headers={
        "Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


class _BreakableStore:
    """The receiver's store, until ``broken`` is set: then reading it fails like a corrupt
    store (``StoreFormatError`` is a ValueError)."""

    def __init__(self, store: SpanStore) -> None:
        self.store, self.broken = store, False

    def metric_points(self) -> list[dict]:
        if self.broken:
            raise ValueError("metrics store: line 3: not JSON")
        return self.store.metric_points()


@pytest.fixture
def breakable(receiver):
    return _BreakableStore(receiver.store)


@pytest.fixture
def endpoint(breakable):
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(breakable, "127.0.0.1", 0, None, stop, ready),
                              daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{ready.port}/metrics"
    stop.set()
    thread.join(10)


def test_scrape_endpoint_shows_our_instruments_as_the_collector_would(receiver, endpoint):
    out = subprocess.run([sys.executable, "-c", EMIT, receiver.http_endpoint],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    trace_id = out.stdout.strip().splitlines()[-1]
    receiver.wait_for_spans(lambda _: receiver.store.metric_points(), 10)
    text = _scrape(endpoint)
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    hist = fams["ttft_activation_stage_duration_seconds"]
    assert hist.type == "histogram"
    compile_buckets = {s.labels["le"]: s.value for s in hist.samples
                       if s.name.endswith("_bucket") and s.labels["ttft_stage"] == "warmup.compile"}
    assert compile_buckets["2.5"] == 1 and compile_buckets["5"] == 2
    assert compile_buckets["+Inf"] == 2 and "5.0" not in compile_buckets
    sample = hist.samples[0]
    assert sample.labels["job"] == "vllm-x" and sample.labels["instance"] == "proc-1"
    assert sample.labels["gen_ai_request_model"] == "tiny"
    assert sample.labels["otel_scope_name"] == "otel_ttft"

    last = {s.labels["ttft_stage"]: s.value
            for s in fams["ttft_activation_stage_last_duration_seconds"].samples}
    assert last == {"warmup.compile": 4.0, "load.read": 0.75}
    (ratio,) = fams["ttft_activation_compile_cache_hit_ratio"].samples
    assert ratio.value == 0.5
    (read,) = fams["ttft_load_read_bytes"].samples  # the family name drops _total
    assert read.name == "ttft_load_read_bytes_total" and read.value == 1000
    assert "ttft_load_read_throughput_gigabytes_per_second" in fams
    (waiting,) = fams["ttft_request_arrival_waiting_requests"].samples
    assert waiting.value == 2
    (kv,) = fams["ttft_request_arrival_kv_usage_ratio"].samples
    assert kv.value == 0.25

    ttft = fams["gen_ai_server_time_to_first_token_seconds"]
    exemplars = [s.exemplar for s in ttft.samples if s.exemplar]
    assert [e.labels["trace_id"] for e in exemplars] == [trace_id]
    assert {s.labels["ttft_request_cold"] for s in ttft.samples} == {"true"}
    stage_time = fams["ttft_request_stage_time_seconds"]  # the family name drops _total
    assert stage_time.type == "counter"
    assert {s.labels["ttft_stage"]: s.value for s in stage_time.samples} == {
        "queue": 0.01, "prefill": 0.02}

    (info,) = fams["target"].samples
    assert info.labels["job"] == "vllm-x" and info.labels["instance"] == "proc-1"
    assert "service_name" not in info.labels


def test_scrape_endpoint_survives_garbage_and_a_corrupt_store(receiver, breakable, endpoint):
    receiver.store.add_metric_points([_point(name="ok.metric")])
    host, port = endpoint.split("//")[1].split("/")[0].split(":")
    for junk in (b"\x00\xff" * 1000, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
                 b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nxx"):
        # The server may answer 400 and close before reading it all: a reset is fine.
        with socket.create_connection((host, int(port)), timeout=5) as sock, \
                contextlib.suppress(OSError):
            sock.sendall(junk)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    assert "ok_metric_total" in _scrape(endpoint)
    # An unreadable store: the scrape fails (Prometheus marks the target down)...
    breakable.broken = True
    with pytest.raises(urllib.error.HTTPError) as err:
        _scrape(endpoint)
    assert err.value.code == 500
    # ...and works again once the store is readable: the server never died.
    breakable.broken = False
    assert "ok_metric_total" in _scrape(endpoint)


def test_expired_series_leave_the_scrape(receiver, endpoint):
    old = time.time_ns() - 3600 * 10**9
    receiver.store.add_metric_points([_point(name="old.metric", time_ns=old),
                                      _point(name="new.metric", time_ns=time.time_ns())])
    from otel_ttft.tools.prom.exposition import StoreCollector

    names = {f.name for f in StoreCollector(receiver.store, expire_s=1800).collect()}
    assert "new_metric" in names and "old_metric" not in names


@pytest.mark.parametrize("args", [["--dir", "/nonexistent/otel-ttft"],
                                  ["--dir", ".", "--host", "0.0.0.0"],
                                  ["--dir", ".", "--port", "99999999"]])
def test_cli_errors_are_one_line_and_exit_2(args, tmp_path):
    out = subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", "prometheus", *args],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_cli_writes_openmetrics_history(receiver, tmp_path):
    receiver.store.add_metric_points([_point(name="a.metric", time_ns=10**18, value=1),
                                      _point(name="a.metric", time_ns=10**18 + 10**9, value=2)])
    out = subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", "prometheus", "--dir",
                          str(receiver.store.directory), "--openmetrics", "-", "--shift", "60"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    samples = [line for line in out.stdout.splitlines() if line.startswith("a_metric_total")]
    assert [s.rsplit(" ", 1)[1] for s in samples] == ["1000000060.0", "1000000061.0"]
    assert out.stdout.rstrip().endswith("# EOF")


def _stage_metrics():
    """A ``stage_metrics`` part on a meter provider of its own."""
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_ttft.runtime import config
    from otel_ttft.runtime.state import PartSpec, ProcessState
    from otel_ttft.runtime.telemetry import metrics

    state = ProcessState(config.Config(meter_provider=MeterProvider()),
                         [PartSpec(metrics.PART, metrics.StageMetrics)])
    return state, state.part(metrics.PART)


def test_latest_activation_gauges_start_afresh_with_a_new_activation():
    """Within one activation the longest span of a stage wins; a new activation (another trace,
    e.g. a wake-up) replaces the values, so the gauge is the latest activation's."""
    state, part = _stage_metrics()
    part.record_activation_stage("load.read", 1.0, "m", trace_id=1)
    part.record_activation_stage("load.read", 3.0, "m", trace_id=1)
    part.record_activation_stage("load.read", 2.0, "m", trace_id=1)
    part.record_activation_stage("warmup.compile", 5.0, "m", trace_id=1, cache_hit=False)
    assert part.last[("load.read", "m")][1] == 3.0
    part.record_activation_stage("load.read", 0.5, "m", trace_id=2)
    part.record_activation_stage("warmup.compile", 1.0, "m", trace_id=2, cache_hit=True)
    part.record_activation_stage("warmup.compile", 1.0, "m", trace_id=2, cache_hit=True)
    observed = {tuple(sorted(o.attributes.items())): o.value
                for o in part.last_feed(None)}
    assert observed[(("gen_ai.request.model", "m"), ("ttft.stage", "load.read"))] == 0.5
    (ratio,) = list(part.compile_feed(None))
    assert ratio.value == 1.0
    state.close()
    assert list(part.last_feed(None)) == [] and list(part.compile_feed(None)) == []


def test_stages_that_ended_before_the_model_was_known_carry_it_at_export():
    state, part = _stage_metrics()
    assert state.identity.served_model is None
    part.record_activation_stage("warmup.process_start", 12.0, None, trace_id=7)
    state.identity.served_model = "m"  # as the activation part notes it
    part.record_activation_stage("warmup.process_start", 3.0, "m", trace_id=7)
    (obs,) = list(part.observe_last(None))
    assert obs.attributes == {"ttft.stage": "warmup.process_start",
                              "gen_ai.request.model": "m"}
    assert obs.value == 12.0
    state.close()
