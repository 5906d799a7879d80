"""The replay client's TTFT metric (``gen_ai.client.operation.time_to_first_chunk``): recorded per
streamed request with the right value and attributes, labelled cold when the request waited for a
switch, exported over real OTLP to our receiver, and read back by the TTFT dashboard's client
panel on a real Prometheus.

The chat endpoint here is a small local SSE server: these tests are about the client, not vLLM
(tests/test_verdicts_vllm.py drives the same client against a real vLLM)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.tools.prom import naming
from otel_ttft.tools.replay import drivers
from otel_ttft.tools.replay.client import (
    ChatClient,
    Sampling,
    make_meter_provider,
    make_tracer_provider,
)
from otel_ttft.tools.replay.progress import Progress
from otel_ttft.tools.replay.prompts import build_prompts
from otel_ttft.tools.replay.runner import ReplayRun
from tests.prom_helpers import (
    api,
    backfill,
    dashboards,
    have_prometheus,
    panels,
    prom_queries,
    prometheus,
)

DELAY_S = {"a": 0.05, "b": 0.3}  # before the first content chunk, per model
CLIENT_TTFT = naming.metric_name(semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, "s", naming.HISTOGRAM)
SCENARIOS = (semconv.SCENARIO_COLD_SWITCH, semconv.SCENARIO_SWITCH_BACK,
             semconv.SCENARIO_RESIDENT_DUAL, semconv.SCENARIO_SHORT_PROMPT)


class _Chat(BaseHTTPRequestHandler):
    """OpenAI-style streamed chat completion: a role-only chunk at once (no content: not the
    first token), the content after the model's delay, then usage and ``[DONE]``."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append(body)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def send(obj: object) -> None:
            self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        time.sleep(DELAY_S[body["model"]])
        send({"choices": [{"index": 0, "delta": {"content": "Hello"}}]})
        send({"choices": [{"index": 0, "delta": {"content": " there"}}]})
        send({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chat_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _points(reader: InMemoryMetricReader) -> list[tuple[object, object, object]]:
    """(resource, metric, data point) of the client TTFT histogram."""
    data = reader.get_metrics_data()
    return [(rm.resource, m, p) for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics for m in sm.metrics
            if m.name == semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK for p in m.data.data_points]


def test_a_streamed_request_records_its_client_ttft_with_the_request_attributes(chat_url):
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = make_tracer_provider("http://127.0.0.1:1", exporter=spans)
    meter_provider = make_meter_provider("http://127.0.0.1:1", reader=reader)
    client = ChatClient(tracer_provider.get_tracer("t"), Sampling(), 10, meter_provider)
    result = client.request("b", [{"role": "user", "content": "secret text"}], lambda: chat_url,
                            {semconv.ATTR_REPLAY_SCENARIO: "cold-switch"},
                            metric_attributes={semconv.ATTR_REPLAY_SCENARIO: "cold-switch",
                                               semconv.ATTR_REQUEST_COLD: True})
    client.close()
    tracer_provider.force_flush()
    assert result.error is None and result.ttft_s is not None and result.input_tokens == 7
    assert result.ttft_s >= DELAY_S["b"]  # the role-only chunk did not count as the first token

    ((resource, metric, point),) = _points(reader)
    assert metric.unit == "s"
    assert resource.attributes["service.name"] == semconv.REPLAY_SERVICE_NAME
    assert dict(point.attributes) == {
        semconv.GEN_AI_OPERATION_NAME: "chat", semconv.GEN_AI_REQUEST_MODEL: "b",
        semconv.ATTR_REPLAY_SCENARIO: "cold-switch", semconv.ATTR_REQUEST_COLD: True}
    assert point.count == 1 and point.sum == pytest.approx(result.ttft_s)
    # The project's TTFT buckets, not the SDK's default that stops at 10 s.
    assert tuple(point.explicit_bounds) == tuple(map(float, semconv.TTFT_BUCKETS_S))
    assert max(point.explicit_bounds) >= 600
    # The same value as the span attribute, and the exemplar names the request's trace.
    (span,) = [s for s in spans.get_finished_spans() if s.name == semconv.SPAN_REPLAY_REQUEST]
    assert span.attributes[semconv.ATTR_CLIENT_TTFT] == pytest.approx(point.sum)
    assert [e.trace_id for e in point.exemplars] == [span.context.trace_id]
    assert all("secret" not in str(v) for v in point.attributes.values())
    meter_provider.shutdown()
    tracer_provider.shutdown()


def test_no_first_chunk_records_nothing(chat_url):
    reader = InMemoryMetricReader()
    tracer_provider = make_tracer_provider("http://127.0.0.1:1", exporter=InMemorySpanExporter())
    client = ChatClient(tracer_provider.get_tracer("t"), Sampling(), 5,
                        make_meter_provider("http://127.0.0.1:1", reader=reader))
    dead = client.request("a", [], lambda: "http://127.0.0.1:1", {})
    gone = client.request("a", [], lambda: (_ for _ in ()).throw(RuntimeError("switch failed")),
                          {})
    client.close()
    tracer_provider.shutdown()
    assert dead.error and gone.error == "RuntimeError: switch failed"
    assert _points(reader) == []


def _replay(driver: drivers.Driver, reader_or_provider, repeat: int = 1) -> ReplayRun:
    meter_provider = (reader_or_provider if not isinstance(reader_or_provider, InMemoryMetricReader)
                      else make_meter_provider("http://127.0.0.1:1", reader=reader_or_provider))
    run = ReplayRun(driver, "a", "b", build_prompts(
        lambda messages: sum(len(m["content"].split()) for m in messages), 200, 4),
                    SCENARIOS, repeat=repeat, progress=Progress(live=False))
    tracer_provider = make_tracer_provider("http://127.0.0.1:1", exporter=InMemorySpanExporter())
    run.run(tracer_provider, 10, meter_provider)
    tracer_provider.shutdown()
    return run


def _series(reader: InMemoryMetricReader) -> dict[tuple, tuple[int, float]]:
    """(scenario, model, cold) -> (count, sum)."""
    out = {}
    for _, _, p in _points(reader):
        a = p.attributes
        out[(a[semconv.ATTR_REPLAY_SCENARIO], a[semconv.GEN_AI_REQUEST_MODEL],
             a[semconv.ATTR_REQUEST_COLD])] = (p.count, p.sum)
    return out


def test_a_replay_labels_requests_that_waited_for_a_switch_as_cold(chat_url):
    """Through a router that swaps by model name: the cold start (cold-switch) and the switch back
    waited; the resident pair and the warm short prompt did not. Warm-up requests are not
    measured."""
    reader = InMemoryMetricReader()
    targets = [drivers.Target("a"), drivers.Target("b")]
    run = _replay(drivers.ProxyDriver(targets, Progress(live=False), proxy_url=chat_url), reader,
                  repeat=2)
    series = _series(reader)
    assert set(series) == {("cold-switch", "b", True), ("switch-back", "a", True),
                           ("resident-dual", "a", False), ("resident-dual", "b", False),
                           ("short-prompt", "a", False)}
    for (scenario, model, _cold), (count, total) in series.items():
        ttfts = [r.result.ttft_s for r in run.records
                 if r.scenario == scenario and r.step.model == model]
        assert count == len(ttfts) == 2 and total == pytest.approx(sum(ttfts))


def test_the_resident_driver_never_labels_a_request_cold(chat_url):
    reader = InMemoryMetricReader()
    targets = [drivers.Target("a", url=chat_url), drivers.Target("b", url=chat_url)]
    _replay(drivers.ResidentDriver(targets, Progress(live=False)), reader)
    series = _series(reader)
    assert len(series) == 5 and not any(cold for _, _, cold in series)


def test_the_replay_command_exports_the_metric_next_to_its_spans(chat_url, receiver, tiny_model,
                                                                  tmp_path):
    """``otel-ttft replay`` through a router: the metric reaches the spans' OTLP endpoint by the
    time the command returns (flushed and shut down with the tracer provider)."""
    from otel_ttft.tools import cli

    code = cli.main(["replay", "--driver", "proxy", "--proxy-url", chat_url, "--name-a", "a",
                     "--name-b", "b", "--tokenizer", str(tiny_model), "--scenarios",
                     "cold-switch,short-prompt", "--repeat-warm", "2",
                     "--otlp-endpoint", receiver.http_endpoint, "--out", str(tmp_path / "out")])
    assert code == 0
    points = [p for p in receiver.store.metric_points()
              if p["name"] == semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]
    latest = {(p["attributes"][semconv.ATTR_REPLAY_SCENARIO],
               p["attributes"][semconv.ATTR_REQUEST_COLD]): p for p in points}
    # the switch once (--repeat 1), the cheap scenario twice (--repeat-warm 2)
    assert {k: p["count"] for k, p in latest.items()} == {("cold-switch", True): 1,
                                                          ("short-prompt", False): 2}
    assert all(p["resource"]["service.name"] == semconv.REPLAY_SERVICE_NAME
               for p in latest.values())
    requests = [s for s in receiver.store.spans() if s["name"] == semconv.SPAN_REPLAY_REQUEST]
    for (scenario, _), p in latest.items():
        assert sum(s["attributes"][semconv.ATTR_CLIENT_TTFT] for s in requests
                   if s["attributes"][semconv.ATTR_REPLAY_SCENARIO] == scenario) == \
            pytest.approx(p["sum"])


def _client_panel_targets() -> list[dict]:
    return [t for p in panels(dashboards()["otel-ttft-ttft.json"])
            if p.get("title", "").startswith("Client TTFT") for t in p.get("targets") or []]


def test_the_dashboards_client_ttft_panel_queries_the_collectors_name():
    assert CLIENT_TTFT == "gen_ai_client_operation_time_to_first_chunk_seconds"
    targets = _client_panel_targets()
    assert [t["expr"].split("(", 1)[1].split(",")[0] for t in targets] == ["0.5", "0.95", "0.99"]
    for t in targets:
        assert f"{CLIENT_TTFT}_bucket{{" in t["expr"]
        assert f'job="{semconv.REPLAY_SERVICE_NAME}"' in t["expr"]
        assert "ttft_request_cold" in t["expr"] and "gen_ai_request_model" in t["expr"]
        assert t["exemplar"] is True


@pytest.mark.skipif(not have_prometheus(), reason="needs prometheus and promtool")
def test_client_ttft_panel_on_a_real_prometheus(chat_url, receiver, tmp_path):
    """Two replays exported over OTLP/HTTP to our receiver, the points as the Collector would
    expose them backfilled into Prometheus 2.42: every client quantile query returns, per model
    and cold/warm, a value inside the buckets of the second replay's measured TTFTs."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from otel_ttft.tools.prom.exposition import openmetrics_history

    # Exports only when each replay flushes at its end: a periodic export in the middle of the
    # first replay (5 s on a loaded machine) would put some of its requests into the rate window.
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=receiver.http_endpoint + "/v1/metrics"),
        export_interval_millis=3_600_000)
    meter_provider = make_meter_provider(receiver.http_endpoint, reader=reader)
    targets = [drivers.Target("a"), drivers.Target("b")]
    driver = drivers.ProxyDriver(targets, Progress(live=False), proxy_url=chat_url)
    _replay(driver, meter_provider)  # export 1: every series has a first sample
    time.sleep(1.1)
    second = _replay(driver, meter_provider)  # export 2: the rate is this replay's requests
    meter_provider.shutdown(timeout_millis=10_000)
    points = [p for p in receiver.store.metric_points()
              if p["name"] == semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK]
    assert len({p["time_ns"] for p in points}) >= 2, points  # + the export at shutdown

    data = tmp_path / "prom-data"
    data.mkdir()
    backfill(openmetrics_history(points), data, tmp_path, "client")
    measured: dict[tuple[str, str], list[float]] = {}
    for r in second.records:
        cold = r.scenario in ("cold-switch", "switch-back")
        measured.setdefault((r.step.model, "true" if cold else "false"), []).append(r.result.ttft_s)
    bounds = [0.0, *map(float, semconv.TTFT_BUCKETS_S)]
    queries = [q for q in prom_queries() if CLIENT_TTFT in q[3]]
    assert len(queries) == 3
    at = max(p["time_ns"] for p in points) / 1e9
    # The dashboards' $__rate_interval (1m) must reach back to export 1: on a loaded machine the
    # second replay alone can take longer, and a window holding only its own exports rates to 0.
    # It starts just before export 1 (2 ms: promtool keeps milliseconds), not seconds before:
    # rate() extrapolates each series towards the window's start only as far as its counter
    # would reach zero, so buckets whose export-1 counts differ (first replay: slower requests
    # in higher buckets) were stretched by different factors and the quantile moved a bucket up
    # (0.07 against measured TTFTs within 0.04-0.06, CI 2026-12-03).
    window_ms = round((at - min(p["time_ns"] for p in points) / 1e9) * 1000) + 2
    with prometheus(tmp_path, rules=False, data_dir=data) as url:
        for _dash, _id, title, expr in queries:
            assert "[1m]" in expr, expr
            expr = expr.replace("[1m]", f"[{window_ms}ms]")
            out = api(url, "/api/v1/query", query=expr, time=at)
            assert out.get("status") == "success", (title, expr, out)
            got = {(s["metric"]["gen_ai_request_model"], s["metric"]["ttft_request_cold"]):
                   float(s["value"][1]) for s in out["data"]["result"]}
            assert set(got) == set(measured), (expr, out)
            for key, value in got.items():
                lo = max(b for b in bounds if b < min(measured[key]))
                hi = min(b for b in bounds if b >= max(measured[key]))
                assert not math.isnan(value) and lo <= value <= hi, (expr, key, value, lo, hi)
