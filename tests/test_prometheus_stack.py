"""The shipped Prometheus config and alert rules pass promtool (check config, check rules, the
rule unit tests), the compose file passes ``docker-compose config``, and the dashboards are what
the code generates, round-trip through the SDK's models, and query what a real Prometheus
accepts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_ttft import semconv
from tests.prom_helpers import (
    DASHBOARDS_DIR,
    RULES_DIR,
    api,
    dashboards,
    have_prometheus,
    panels,
    prom_queries,
    prometheus,
    traceql_names_and_attributes,
    traceql_stage_values,
)

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[1]
COLLECTOR = ROOT / "collector-config"
IN_CI = bool(os.environ.get("CI"))
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None and not IN_CI,
                                    reason="promtool not installed (scripts/setup installs it)")


def run(*cmd: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


# --- Prometheus config and rules ----------------------------------------------------------------
@needs_promtool
def test_shipped_prometheus_config_with_its_rules_passes_promtool(tmp_path):
    """`check config` also checks every rule file the config loads: point the container path
    (/etc/prometheus/rules/*.yml) at this checkout's rules."""
    cfg = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
    assert cfg["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    cfg["rule_files"] = [str(RULES_DIR / "*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    out = run("promtool", "check", "config", str(tmp_path / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "otel-ttft-warmup.yml" in out.stdout + out.stderr


@needs_promtool
def test_rule_files_pass_promtool_check_rules():
    files = sorted(RULES_DIR.glob("*.yml"))
    assert files
    out = run("promtool", "check", "rules", *map(str, files))
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_rule_unit_tests_pass():
    """Every alert fires on a regression and stays silent on noise, on sparse activations and
    on a model seen once (collector-config/rules/tests/)."""
    tests = sorted((RULES_DIR / "tests").glob("*.yml"))
    assert tests
    out = run("promtool", "test", "rules", *map(str, tests), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def _rules() -> list[dict]:
    doc = yaml.safe_load((RULES_DIR / "otel-ttft-warmup.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_names_model_stage_amount_and_dashboard():
    alerts = [r for r in _rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "OtelTtftWarmupStageRegression", "OtelTtftColdRequestTtftOverObjective",
        "OtelTtftCheckpointReadThroughputCollapse", "OtelTtftCompileCacheMisses",
        "OtelTtftQueueShareRising"}
    uids = {d["uid"] for d in dashboards().values()}
    tested = (RULES_DIR / "tests" / "otel-ttft-warmup.test.yml").read_text()
    for alert in alerts:
        summary = alert["annotations"]["summary"]
        assert "$labels.gen_ai_request_model" in summary, alert["alert"]
        assert "stage" in summary and "$value" in summary, alert["alert"]
        link = alert["annotations"]["dashboard"]
        assert any(f"/d/{uid}?" in link for uid in uids), link
        assert f"alertname: {alert['alert']}" in tested, f"{alert['alert']} has no unit test"


def test_thresholds_live_in_one_place():
    """Alerts read thresholds from the otel_ttft:threshold:* recording rules only."""
    rules = _rules()
    thresholds = {r["record"] for r in rules if r.get("record", "").startswith(
        "otel_ttft:threshold:")}
    assert len(thresholds) >= 6
    used = {t for r in rules if "alert" in r for t in thresholds if t in r["expr"]}
    assert used == thresholds, thresholds - used


# --- compose ----------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("docker-compose") is None and not IN_CI,
                    reason="docker-compose not installed (scripts/setup installs it)")
def test_compose_file_passes_docker_compose_config():
    out = run("docker-compose", "-f", str(COLLECTOR / "docker-compose.yaml"), "config", "-q",
              cwd=COLLECTOR, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


# --- dashboards ---------------------------------------------------------------------------------
def test_dashboards_are_what_the_code_generates(tmp_path):
    pytest.importorskip("grafana_foundation_sdk")
    from otel_ttft.tools.dashboards.__main__ import BUILDERS, main, render

    assert main(["--check", str(DASHBOARDS_DIR)]) == 0, \
        "grafana/dashboards is stale: run `python -m otel_ttft.tools.dashboards`"
    committed = {p.name for p in DASHBOARDS_DIR.glob("*.json")}
    assert committed == set(BUILDERS)
    # And --check does notice a change.
    for name, text in render().items():
        (tmp_path / name).write_text(text.replace("otel-ttft", "changed", 1))
    assert main(["--check", str(tmp_path)]) == 1


def test_dashboards_round_trip_through_the_sdk_models():
    pytest.importorskip("grafana_foundation_sdk")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for name, doc in dashboards().items():
        again = json.loads(JSONEncoder().encode(Dashboard.from_json(doc)))
        assert again == doc, name


def test_every_panel_has_a_unit_a_description_and_a_provisioned_datasource():
    provisioned = {ds["uid"] for ds in yaml.safe_load(
        (ROOT / "grafana/provisioning/datasources/datasources.yaml").read_text())["datasources"]}
    for name, dash in dashboards().items():
        assert {v["name"] for v in dash["templating"]["list"]} == {"model", "service", "instance"}
        for var in dash["templating"]["list"]:
            assert var["datasource"]["uid"] in provisioned
        ids = [p["id"] for p in panels(dash)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels(dash):
            if panel["type"] == "row":
                continue
            where = f"{name}: {panel['title']}"
            assert panel.get("description"), where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"]["uid"] in provisioned, where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] in provisioned, where
                if target["datasource"]["type"] == "prometheus":
                    # The replay client is its own service: its queries pick that job, not the
                    # vLLM processes of $service / $instance.
                    client = f'job="{semconv.REPLAY_SERVICE_NAME}"' in target["expr"]
                    for var in ("$model",) if client else ("$service", "$instance", "$model"):
                        assert var in target["expr"], f"{where}: {var} not applied"


def test_histogram_panels_link_exemplars_to_tempo():
    exemplar_targets = [t for d in dashboards().values() for p in panels(d)
                        for t in p.get("targets") or [] if t.get("exemplar")]
    assert any("gen_ai_server_time_to_first_token_seconds_bucket" in t["expr"]
               for t in exemplar_targets)
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/datasources.yaml").read_text())
    prom = next(d for d in ds["datasources"] if d["uid"] == "prometheus")
    assert {"name": "trace_id", "datasourceUid": "tempo"} in \
        prom["jsonData"]["exemplarTraceIdDestinations"]


def test_traceql_uses_only_semconv_names():
    """Tempo cannot run here: TraceQL panels stick to semconv span names and attributes (the
    vLLM end-to-end test checks each of them against real spans)."""
    names, attrs = traceql_names_and_attributes()
    span_names = {v for k, v in vars(semconv).items() if k.startswith("SPAN_")}
    attr_names = {v for k, v in vars(semconv).items() if k.startswith("ATTR_")}
    assert names and names <= span_names, names - span_names
    assert {semconv.ATTR_STAGE, semconv.ATTR_ACTIVATION_KIND} <= attrs <= attr_names, \
        attrs - attr_names
    assert traceql_stage_values() <= set(semconv.ALL_STAGES)


@pytest.mark.skipif(not have_prometheus() and not IN_CI, reason="needs prometheus")
def test_every_dashboard_query_and_rule_is_accepted_by_a_real_prometheus(tmp_path):
    """On an empty Prometheus 2.42 with the shipped rules loaded: each panel's PromQL parses and
    evaluates (data comes in the vLLM end-to-end test)."""
    queries = prom_queries()
    assert len(queries) >= 15
    with prometheus(tmp_path) as url:
        for dash, _id, title, expr in queries:
            out = api(url, "/api/v1/query", query=expr)
            assert out.get("status") == "success", (dash, title, expr, out)
        groups = api(url, "/api/v1/rules")["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        assert "OtelTtftWarmupStageRegression" in loaded
        for group in groups:
            for rule in group["rules"]:
                assert rule.get("health") in ("ok", "unknown"), rule
