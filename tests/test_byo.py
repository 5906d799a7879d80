"""Bring your own Collector, Prometheus and Grafana: the files in collector-config/byo/ hold what
otel-ttft needs from each (docs/production.md walks them). ``otelcol`` cannot run here, so the
Collector fragments are checked key by key; the Prometheus fragment passes ``promtool check
config`` with the shipped rules and a real Prometheus run on it keeps the emitting process's
``job``; the Grafana data sources stay in step with the shipped stack's."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.prom_helpers import RULES_DIR, api, have_prometheus, prometheus

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
BYO = ROOT / "collector-config" / "byo"
COLLECTOR_FILES = {"scrape": BYO / "otelcol-otel-ttft.yaml",
                   "remote-write": BYO / "otelcol-otel-ttft-remote-write.yaml"}
PROM_FILE = BYO / "prometheus-otel-ttft.yml"
GRAFANA_DS = BYO / "grafana-datasources.yaml"
GRAFANA_DASHBOARDS = BYO / "grafana-dashboards.yaml"
SHIPPED = ROOT / "collector-config" / "otelcol-config.yaml"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (scripts/setup installs it)")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _kind(component_id: str) -> str:
    return component_id.split("/", 1)[0]


# --- the Collector ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(COLLECTOR_FILES))
def test_collector_fragment_has_what_otel_ttft_needs(variant):
    cfg = load(COLLECTOR_FILES[variant])
    pipelines = cfg["service"]["pipelines"]
    assert set(pipelines) == {"traces/otel_ttft", "metrics/otel_ttft"}
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            used = pipeline.get(kind) or []
            assert used, f"{name} has no {kind}"
            assert set(used) <= set(cfg.get(kind) or {}), (name, kind, used)
    # OTLP in, gRPC and HTTP, on loopback only.
    (receiver,) = pipelines["metrics/otel_ttft"]["receivers"]
    assert pipelines["traces/otel_ttft"]["receivers"] == [receiver]
    assert _kind(receiver) == "otlp"
    protocols = cfg["receivers"][receiver]["protocols"]
    assert {p: v["endpoint"] for p, v in protocols.items()} == {
        "grpc": "127.0.0.1:4317", "http": "127.0.0.1:4318"}
    # Traces to Tempo over OTLP/gRPC.
    (traces,) = pipelines["traces/otel_ttft"]["exporters"]
    assert _kind(traces) == "otlp_grpc" and cfg["exporters"][traces]["endpoint"].endswith(":4317")
    # Metrics to Prometheus with resource attributes as labels.
    (metrics,) = pipelines["metrics/otel_ttft"]["exporters"]
    exporter = cfg["exporters"][metrics]
    assert exporter["resource_to_telemetry_conversion"] == {"enabled": True}
    if variant == "scrape":
        assert _kind(metrics) == "prometheus"
        assert exporter["endpoint"].startswith("127.0.0.1:")
        assert exporter["enable_open_metrics"] is True  # exemplars reach Prometheus
    else:
        assert _kind(metrics) == "prometheusremotewrite"
        assert exporter["endpoint"].endswith("/api/v1/write")


@pytest.mark.parametrize("variant", sorted(COLLECTOR_FILES))
def test_collector_fragment_merges_beside_a_config_of_your_own(variant):
    """Passed as a second --config, the fragment adds to a Collector's config: none of its ids
    is one the user's config (here: the shipped one) may already use."""
    ours, theirs = load(COLLECTOR_FILES[variant]), load(SHIPPED)
    for section in ("receivers", "processors", "exporters"):
        assert not set(ours[section]) & set(theirs.get(section) or {}), section
        assert all(cid.split("/", 1)[1].startswith("otel_ttft") for cid in ours[section])
    assert not set(ours["service"]["pipelines"]) & set(theirs["service"]["pipelines"])


def test_collector_fragments_match_the_shipped_exporter_settings():
    """The settings the shipped stack is tested with (exposition, series expiry) are the ones the
    fragment gives, so a user's Collector behaves as the tests' does."""
    shipped = load(SHIPPED)["exporters"]["prometheus"]
    ours = load(COLLECTOR_FILES["scrape"])["exporters"]["prometheus/otel_ttft"]
    for key in ("resource_to_telemetry_conversion", "enable_open_metrics", "metric_expiration"):
        assert ours[key] == shipped[key], key


# --- Prometheus ---------------------------------------------------------------------------------
def _prom_config_on_this_checkout(**overrides: Any) -> dict:
    cfg = load(PROM_FILE)
    assert cfg["rule_files"] == ["/etc/prometheus/otel-ttft/*.yml"]
    cfg["rule_files"] = [str(RULES_DIR / "*.yml")]
    cfg.update(overrides)
    return cfg


def test_prometheus_fragment_scrapes_the_collector_fragment():
    (job,) = load(PROM_FILE)["scrape_configs"]
    assert job["honor_labels"] is True
    (targets,) = [sc["targets"] for sc in job["static_configs"]]
    exporter = load(COLLECTOR_FILES["scrape"])["exporters"]["prometheus/otel_ttft"]
    assert targets == [exporter["endpoint"]]


@needs_promtool
def test_prometheus_fragment_passes_promtool_with_the_shipped_rules(tmp_path):
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(_prom_config_on_this_checkout()))
    out = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    shipped = sorted(p.name for p in (ROOT / "collector-config" / "rules").glob("*.yml"))
    assert len(shipped) >= 4, shipped
    for rules in shipped:
        assert rules in out.stdout + out.stderr, rules


class _Exporter(BaseHTTPRequestHandler):
    """A stand-in for the Collector's prometheus exporter: one verdict series of a process whose
    service.name is "vllm"."""

    body = (b'# TYPE ttft_activation_verdict_seconds gauge\n'
            b'ttft_activation_verdict_seconds{job="vllm",instance="i-1",gen_ai_request_model="m",'
            b'ttft_verdict_outcome="within-noise",ttft_activation_trace_id="t"} 0\n')

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.skipif(not have_prometheus(), reason="needs prometheus and promtool")
def test_a_real_prometheus_on_the_fragment_keeps_the_process_job_and_loads_the_rules(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = _prom_config_on_this_checkout()
        cfg["global"]["scrape_interval"] = "1s"
        cfg["scrape_configs"][0]["static_configs"] = [
            {"targets": [f"127.0.0.1:{server.server_address[1]}"]}]
        with prometheus(tmp_path, config=cfg) as url:
            deadline = time.monotonic() + 60
            while True:
                result = api(url, "/api/v1/query", query="ttft_activation_verdict_seconds")
                if result["data"]["result"] or time.monotonic() > deadline:
                    break
                time.sleep(1)
            (series,) = result["data"]["result"]
            # honor_labels: the process's job and instance, not the scrape job's.
            assert (series["metric"]["job"], series["metric"]["instance"]) == ("vllm", "i-1")
            groups = api(url, "/api/v1/rules")["data"]["groups"]
            shipped = {g["name"] for f in (ROOT / "collector-config" / "rules").glob("*.yml")
                       for g in yaml.safe_load(f.read_text())["groups"]}
            assert {g["name"] for g in groups} == shipped and "otel-ttft-ranks" in shipped
            assert all(r.get("health") in ("ok", "unknown") for g in groups for r in g["rules"])
    finally:
        server.shutdown()


# --- Grafana ------------------------------------------------------------------------------------
def test_grafana_datasources_link_to_each_other_as_the_shipped_ones_do():
    ours = {d["type"]: d for d in load(GRAFANA_DS)["datasources"]}
    shipped = {d["type"]: d for d in load(
        ROOT / "grafana/provisioning/datasources/datasources.yaml")["datasources"]}
    assert set(ours) == {"prometheus", "tempo"}
    uids = {t: d["uid"] for t, d in ours.items()}
    for kind, ds in ours.items():
        assert not ds.get("isDefault"), "leave the user's default data source alone"
        assert not re.match(r"https?://(prometheus|tempo)[:/]", ds["url"]), ds["url"]
        # The same settings as the tested stack, with these uids in place of its own.
        same = yaml.safe_dump(shipped[kind]["jsonData"])
        for t, uid in uids.items():
            same = re.sub(rf"datasourceUid: {shipped[t]['uid']}\b", f"datasourceUid: {uid}", same)
        assert yaml.safe_dump(ds["jsonData"]) == same, kind
    values = "".join(ln for ln in GRAFANA_DS.read_text().splitlines()
                     if not ln.lstrip().startswith("#"))
    assert "$$" in values and "$" not in values.replace("$$", ""), \
        "Grafana expands $VAR in provisioning files: write $$"


def test_grafana_dashboard_provider_reads_files():
    (provider,) = load(GRAFANA_DASHBOARDS)["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False
