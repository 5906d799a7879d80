"""End to end with a real Prometheus: metrics a real instrumented vLLM produced, received by the
embedded OTLP receiver, converted to the Collector's Prometheus names by ``otel_ttft.tools.prom``
and backfilled with ``promtool tsdb create-blocks-from openmetrics``, evaluated by the shipped rules
and queried with every PromQL expression of every dashboard.

Two vLLM starts: a normal one, replayed as the model's activation three hours ago (the baseline;
its last export repeated for 30 idle minutes, as a server that stayed up would have sent it),
and one slowed on purpose (a test plugin sleeps inside the worker's device initialisation), at
its real time. The warm-up alert must fire for the slowed stage, and for no stage that was not
slowed: the other stages of the two real start-ups differ only by noise."""

from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.prom.exposition import openmetrics_history
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.prom_helpers import (
    api,
    backfill,
    have_prometheus,
    prom_queries,
    prometheus,
    traceql_names_and_attributes,
    traceql_stage_values,
    variable_queries,
    wait_for_alerts,
)
from tests.vllm_args import EAGER_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500), pytest.mark.skipif(
    not have_prometheus() and not os.environ.get("CI"), reason="needs prometheus and promtool")]

SLOW_S = 15  # added to warmup.device_init; the alert needs 2x the baseline and +10 s
SLOW_STAGE = semconv.STAGE_WARMUP_DEVICE_INIT
HISTORY_SHIFT_S = -3 * 3600
IDLE_S = 30 * 60  # the normal server's idle life after start-up, as exported

SLOW_PLUGIN = '''
def register():
    """Test only: sleep inside the worker's device initialisation (the "Init device" span)."""
    import os
    import time

    import wrapt

    seconds = float(os.environ.get("OTEL_TTFT_TEST_SLOW_DEVICE_INIT", "0"))
    if not seconds:
        return

    def patch(module):
        inner = module.set_random_seed  # called inside CPUWorker.init_device

        def slow_set_random_seed(*args, **kwargs):
            time.sleep(seconds)
            return inner(*args, **kwargs)

        module.set_random_seed = slow_set_random_seed

    wrapt.register_post_import_hook(patch, "vllm.v1.worker.cpu_worker")
'''


def _complete(server: VllmServer, model: Path, prompt: str) -> None:
    body = json.dumps({"model": str(model), "prompt": prompt, "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def _run(receiver_factory, vllm_plugin, tiny_model: Path, tmp: Path, *, slow: bool,
         requests: int):
    """One real start under opentelemetry-instrument; returns (metric points, spans)."""
    rx = receiver_factory(tmp / "store")
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": rx.http_endpoint}
    if slow:
        env["PYTHONPATH"] = vllm_plugin("ttft_slow_plugin", SLOW_PLUGIN)
        env["OTEL_TTFT_TEST_SLOW_DEVICE_INIT"] = str(SLOW_S)
    server = VllmServer(tiny_model, env=env, extra_args=(*EAGER_ARGS,),
                        log_path=tmp / "server.log")
    try:
        # A start takes ~1 min here idle, several when the machine is shared: generous limit.
        server.start(timeout_s=600)
        for i in range(requests):
            _complete(server, tiny_model, f"request {i} of the {'slow' if slow else 'normal'} "
                                          "start")
            time.sleep(0.5)

        def exported(_spans):
            points = rx.store.metric_points()
            stages = {p["attributes"].get(semconv.ATTR_STAGE) for p in points
                      if p["name"] == semconv.METRIC_ACTIVATION_STAGE_LAST_DURATION}
            ttft = [p["count"] for p in points if p["name"] == semconv.METRIC_SERVER_TTFT]
            return SLOW_STAGE in stages and sum(ttft or [0]) >= requests
        rx.wait_for_spans(exported, 60)
        time.sleep(3)  # a few more exports: rates need more than one sample per series
        server.stop()
        return rx.store.metric_points(), rx.store.spans()
    finally:
        server.stop()  # a no-op when already stopped
        rx.stop()


@pytest.fixture
def receiver_factory():
    from otel_ttft.tools.sink.receiver import OTLPReceiver
    from otel_ttft.tools.sink.store import SpanStore

    def make(directory: Path) -> OTLPReceiver:
        return OTLPReceiver(SpanStore(directory)).start()
    return make


def _idle_exports(points: list[dict], seconds: float, every_s: float = 15) -> list[dict]:
    """What the normal server would have exported had it stayed up ``seconds`` more, idle: its
    last point of every series, unchanged, every ``every_s``. In production a server lives for
    hours and its few start-up minutes (gauges of processes not yet exported) weigh nothing in the
    7-day median; a test server stopped right after start-up would be judged on them."""
    latest: dict[tuple, dict] = {}
    for p in sorted(points, key=lambda p: p["time_ns"]):
        key = (p["name"], json.dumps(p["attributes"], sort_keys=True),
               json.dumps(p["resource"], sort_keys=True))
        latest[key] = p
    return [{**p, "time_ns": p["time_ns"] + int(k * every_s * 1e9), "exemplars": []}
            for p in latest.values() for k in range(1, int(seconds / every_s) + 1)]


def _value(point_list: list[dict], stage: str) -> float:
    values = [p["value"] for p in point_list
              if p["name"] == semconv.METRIC_ACTIVATION_STAGE_LAST_DURATION
              and p["attributes"].get(semconv.ATTR_STAGE) == stage]
    return max(values)


@pytest.mark.acceptance
def test_warmup_alert_and_dashboards_on_real_vllm_metrics(receiver_factory, vllm_plugin, tiny_model,
                                                          tmp_path):
    normal_points, normal_spans = _run(receiver_factory, vllm_plugin, tiny_model,
                                       tmp_path / "normal", slow=False, requests=6)
    slow_points, slow_spans = _run(receiver_factory, vllm_plugin, tiny_model, tmp_path / "slow",
                                   slow=True, requests=4)
    # The injected sleep is where it should be, measured by our own span.
    assert _value(slow_points, SLOW_STAGE) >= SLOW_S > 2 * _value(normal_points, SLOW_STAGE)

    data = tmp_path / "prom-data"
    data.mkdir()
    normal_points = normal_points + _idle_exports(normal_points, IDLE_S)
    last_normal = max(p["time_ns"] for p in normal_points) / 1e9
    shift = time.time() + HISTORY_SHIFT_S - last_normal
    backfill(openmetrics_history(normal_points, shift), data, tmp_path, "history")
    backfill(openmetrics_history(slow_points), data, tmp_path, "latest")
    slow_start = min(p["time_ns"] for p in slow_points) / 1e9

    with prometheus(tmp_path, data_dir=data) as url:
        def warmup_alerts(alerts):
            return [a for a in alerts if a["labels"]["alertname"] ==
                    "OtelTtftWarmupStageRegression" and a["state"] == "firing"]
        alerts = wait_for_alerts(url, lambda a: bool(warmup_alerts(a)))
        firing = warmup_alerts(alerts)
        stages = {a["labels"]["ttft_stage"] for a in firing}
        assert SLOW_STAGE in stages, (alerts, api(url, "/api/v1/rules"))
        # Only the slowed stage, or the warm-up container that holds it, regressed.
        assert stages <= {SLOW_STAGE, semconv.STAGE_WARMUP}, stages
        (alert,) = [a for a in firing if a["labels"]["ttft_stage"] == SLOW_STAGE]
        assert alert["labels"]["gen_ai_request_model"] == str(tiny_model)
        assert alert["labels"]["job"] == EXPORT_ENV["OTEL_SERVICE_NAME"]
        summary = alert["annotations"]["summary"]
        assert str(tiny_model) in summary and SLOW_STAGE in summary, summary
        assert "7-day median of" in summary and "s in the latest activation" in summary, summary
        assert "/d/otel-ttft-activations?" in alert["annotations"]["dashboard"]
        # Nothing else about these two healthy starts is alarming.
        others = {a["labels"]["alertname"] for a in alerts
                  if a["labels"]["alertname"] != "OtelTtftWarmupStageRegression"}
        assert not others & {"OtelTtftColdRequestTtftOverObjective",
                             "OtelTtftQueueShareRising"}, others

        # Every PromQL expression of every dashboard runs; the key panels return data.
        end = time.time()
        results = {}
        for dash, _panel_id, title, expr in prom_queries():
            out = api(url, "/api/v1/query_range", query=expr, start=slow_start - 30, end=end,
                      step=5)
            assert out.get("status") == "success", (dash, title, expr, out)
            values = [float(v) for series in out["data"]["result"] for _, v in series["values"]]
            results.setdefault((dash, title), []).extend(
                v for v in values if not math.isnan(v))
        for key in [("otel-ttft-ttft.json", "Server TTFT p50 / p95 / p99 by model, cold vs. warm"),
                    ("otel-ttft-ttft.json", "Stage share of server TTFT per model (stacked)"),
                    ("otel-ttft-ttft.json", "Time per request by stage, cold vs. warm"),
                    ("otel-ttft-admission.json",
                     "Queue time per request, and the TTFT p95 it sits in"),
                    ("otel-ttft-activations.json", "Activation stages per model (stacked, latest "
                                                   "activation of each process)"),
                    ("otel-ttft-activations.json", "Stage vs. its 7-day median (alert input)"),
                    ("otel-ttft-activations.json", "Checkpoint read GB/s per process"),
                    ("otel-ttft-admission.json", "KV-cache usage at arrival")]:
            assert results.get(key), f"no data for {key}"
        shares = results[("otel-ttft-ttft.json", "Stage share of server TTFT per model (stacked)")]
        assert all(0 <= s <= 1.0001 for s in shares), shares

        # The variables (service, instance, model) list what these runs sent.
        for name, selector, label in variable_queries():
            out = api(url, f"/api/v1/label/{label}/values", **{"match[]": selector},
                      start=slow_start - 30, end=end)
            assert out.get("status") == "success" and out["data"], (name, selector, out)
            if name == "model":
                assert str(tiny_model) in out["data"]
            if name == "service":
                assert EXPORT_ENV["OTEL_SERVICE_NAME"] in out["data"]

    # TraceQL panels (Tempo cannot run here) use only span names and attributes these real
    # runs emitted.
    spans = normal_spans + slow_spans
    names, attrs = traceql_names_and_attributes()
    seen_names = {s["name"] for s in spans}
    seen_attrs = {k for s in spans for k in s["attributes"]}
    assert names <= seen_names, names - seen_names
    assert attrs <= seen_attrs, attrs - seen_attrs
    seen_stages = {s["attributes"].get(semconv.ATTR_STAGE) for s in spans}
    assert traceql_stage_values() <= seen_stages, traceql_stage_values() - seen_stages
