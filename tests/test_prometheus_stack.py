"""The shipped Prometheus config and alert rules pass promtool (check config, check rules, the
rule unit tests), the compose file passes ``docker-compose config``, and the dashboards are what
the code generates, round-trip through the SDK's models, and query what a real Prometheus
accepts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from otel_ttft import semconv
from tests.prom_helpers import (
    DASHBOARDS_DIR,
    IMPORT_DIR,
    RULES_DIR,
    api,
    dashboards,
    have_prometheus,
    panels,
    prom_queries,
    prometheus,
    substitute,
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


def _rules_copy(tmp_path: Path, **edits: tuple[str, str]) -> Path:
    """collector-config/rules/ copied to tmp_path with ``file=(old, new)`` text edits (each old
    text must be there); returns the copy."""
    copy = tmp_path / "rules"
    shutil.copytree(RULES_DIR, copy)
    for name, (old, new) in edits.items():
        path = copy / f"{name}.yml"
        assert old in path.read_text(), (name, old)
        path.write_text(path.read_text().replace(old, new))
    return copy


WINDOW = ("\n          unless on (job, instance, ttft_activation_trace_id)\n"
          "            present_over_time(ttft_activation_verdict_seconds[1h] offset 6h)\n")


@needs_promtool
def test_the_verdict_alert_resolution_test_fails_when_the_alert_never_resolves(tmp_path):
    """The unit test that has OtelTtftActivationSlowerThanUsual resolve is not vacuous: without
    the 6-hour window the alert fires for the life of the process, and the test says so."""
    rules = _rules_copy(tmp_path, **{"otel-ttft-warmup": (WINDOW, "\n")})
    out = run("promtool", "test", "rules", str(rules / "tests" / "otel-ttft-warmup.test.yml"))
    assert out.returncode != 0
    failed = {m for m in re.findall(r"alertname: (\w+), time: (\w+)", out.stdout + out.stderr)}
    assert failed == {("OtelTtftActivationSlowerThanUsual", "6h1m"),
                      ("OtelTtftActivationSlowerThanUsual", "7h30m"),
                      ("OtelTtftActivationSlowerThanUsual", "8h10m")}, out.stdout


def _dashboard_link(tmp_path: Path, rules: Path, with_settings: bool) -> str:
    """The ``dashboard`` annotation of a firing verdict alert, as promtool renders it."""
    verdict = ('ttft_activation_verdict_seconds{job="vllm",instance="a",gen_ai_request_model='
               '"m/1",ttft_stage="warmup",ttft_verdict_substage="warmup.compile",'
               'ttft_verdict_recommendation="r",ttft_verdict_change="c",ttft_verdict_outcome='
               '"expanded",ttft_verdict_baseline="thin",ttft_verdict_phase="ready",'
               'ttft_activation_trace_id="t"}')
    files = [str(rules / "otel-ttft-warmup.yml")]
    if with_settings:
        files.append(str(rules / "otel-ttft-settings.yml"))
    test = {"rule_files": files, "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": verdict, "values": "10x30"}],
        "alert_rule_test": [{"eval_time": "10m", "alertname": "OtelTtftActivationSlowerThanUsual",
                             "exp_alerts": [{"exp_labels": {}, "exp_annotations": {}}]}]}]}
    (tmp_path / "link.test.yml").write_text(yaml.safe_dump(test))
    out = run("promtool", "test", "rules", str(tmp_path / "link.test.yml"))
    assert out.returncode != 0  # the expectation is empty on purpose: the output shows the alert
    links = re.findall(r'dashboard="([^"]*)"', out.stdout + out.stderr)
    assert links, out.stdout + out.stderr
    return links[0]


@needs_promtool
def test_the_grafana_url_of_alert_links_is_a_setting(tmp_path):
    """The ``dashboard`` annotations start with the URL in otel-ttft-settings.yml; without that
    file they are the path alone, never a host we guessed."""
    shipped = _dashboard_link(tmp_path, RULES_DIR, with_settings=True)
    assert shipped == "http://127.0.0.1:3000/d/otel-ttft-activations?var-model=m%2F1&var-service=vllm"
    theirs = _rules_copy(tmp_path, **{"otel-ttft-settings": (
        '"http://127.0.0.1:3000"', '"https://grafana.example.com/sub"')})
    assert _dashboard_link(tmp_path, theirs, with_settings=True) == \
        "https://grafana.example.com/sub/d/otel-ttft-activations?var-model=m%2F1&var-service=vllm"
    assert _dashboard_link(tmp_path, RULES_DIR, with_settings=False) == \
        "/d/otel-ttft-activations?var-model=m%2F1&var-service=vllm"
    text = (RULES_DIR / "otel-ttft-warmup.yml").read_text()
    assert "127.0.0.1" not in text and "localhost" not in text


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

    assert main(["--check", str(DASHBOARDS_DIR.parent)]) == 0, \
        "grafana/dashboards or grafana/import is stale: run `python -m otel_ttft.tools.dashboards`"
    for directory in (DASHBOARDS_DIR, IMPORT_DIR):
        assert {p.name for p in directory.glob("*.json")} == set(BUILDERS), directory
    assert set(render()) == {f"{d}/{n}" for d in ("dashboards", "import") for n in BUILDERS}
    # And --check does notice a change, in either form.
    for form in ("dashboards", "import"):
        for path, text in render().items():
            changed = text.replace("otel-ttft", "changed", 1) if path.startswith(form) else text
            (tmp_path / form / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / form / path).write_text(changed)
        assert main(["--check", str(tmp_path / form)]) == 1, form


def test_dashboards_round_trip_through_the_sdk_models():
    pytest.importorskip("grafana_foundation_sdk")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for name, doc in dashboards().items():
        again = json.loads(JSONEncoder().encode(Dashboard.from_json(doc)))
        assert again == doc, name


def test_every_panel_has_a_unit_a_description_and_a_datasource_variable():
    for name, dash in dashboards().items():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert set(variables) == {"prometheus", "tempo", "model", "service", "instance"}
        for var in variables.values():
            if var["type"] == "query":
                assert var["datasource"] == DS_REFS["prometheus"], (name, var["name"])
        ids = [p["id"] for p in panels(dash)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels(dash):
            if panel["type"] == "row":
                continue
            where = f"{name}: {panel['title']}"
            assert panel.get("description"), where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"] in DS_REFS.values(), where
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], where
                if target["datasource"]["type"] == "prometheus":
                    # The replay client is its own service: its queries pick that job, not the
                    # vLLM processes of $service / $instance.
                    client = f'job="{semconv.REPLAY_SERVICE_NAME}"' in target["expr"]
                    for var in ("$model",) if client else ("$service", "$instance", "$model"):
                        assert var in target["expr"], f"{where}: {var} not applied"


# --- dashboards for any Grafana -----------------------------------------------------------------
# The data-source variables and the references every panel, target and query variable makes.
DS_REFS = {"prometheus": {"type": "prometheus", "uid": "${prometheus}"},
           "tempo": {"type": "tempo", "uid": "${tempo}"}}
# Grafana's built-in pseudo data sources (annotations), not an instance's data source.
BUILTIN_DS = {"grafana", "-- Grafana --", "-- Mixed --", "-- Dashboard --"}


def fixed_datasource_refs(doc: object, where: str = "") -> list[str]:
    """Every place a dashboard names a data source other than through a variable: a
    ``datasource`` object or string, ``datasourceUid``, or a link's Explore state."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            here = f"{where}/{key}"
            if key == "datasource" and isinstance(value, dict):
                uid = value.get("uid")
                if uid is None or not str(uid).startswith("$") and uid not in BUILTIN_DS:
                    found.append(f"{here}={value}")
            elif key in ("datasource", "datasourceUid") and isinstance(value, str) and not (
                    value.startswith("$") or value in BUILTIN_DS):
                found.append(f"{here}={value}")
            elif isinstance(value, str) and "datasource" in urllib.parse.unquote(value):
                for uid in re.findall(r'"datasource":"([^"]*)"', urllib.parse.unquote(value)):
                    if not uid.startswith("$"):
                        found.append(f"{here}: link to data source {uid}")
            found += fixed_datasource_refs(value, here)
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            found += fixed_datasource_refs(item, f"{where}/{i}")
    return found


def test_the_fixed_uid_check_finds_each_kind_of_fixed_reference():
    """The check below is not vacuous: the shapes the dashboards used to have are found."""
    link = "/explore?left=" + urllib.parse.quote('{"datasource":"tempo","queries":[]}', safe="")
    old = {"panels": [{"datasource": {"type": "prometheus", "uid": "prometheus"},
                       "targets": [{"datasource": {"type": "tempo", "uid": "tempo"}}],
                       "fieldConfig": {"overrides": [{"properties": [
                           {"value": [{"url": link}]}]}]}}],
           "templating": {"list": [{"datasource": "prometheus"},
                                   {"datasource": {"type": "prometheus"}}]}}
    assert len(fixed_datasource_refs(old)) == 5, fixed_datasource_refs(old)
    assert fixed_datasource_refs({"panels": [{"datasource": DS_REFS["tempo"]}]}) == []


@pytest.mark.parametrize("directory", [DASHBOARDS_DIR, IMPORT_DIR], ids=["provisioned", "import"])
def test_no_dashboard_names_a_fixed_datasource_uid(directory):
    """Panels, targets and query variables name the data source through the ``prometheus`` and
    ``tempo`` variables (type datasource), so the dashboards work in any Grafana; nothing links
    to a fixed host either."""
    docs = dashboards(directory)
    assert len(docs) == 3
    for name, dash in docs.items():
        assert fixed_datasource_refs(dash) == [], name
        ds_vars = {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "datasource"}
        assert {n: v["query"] for n, v in ds_vars.items()} == {"prometheus": "prometheus",
                                                             "tempo": "tempo"}, name
        refs = [json.dumps(t["datasource"], sort_keys=True) for p in panels(dash)
                for t in [p, *(p.get("targets") or [])] if "datasource" in t]
        refs += [json.dumps(v["datasource"], sort_keys=True) for v in dash["templating"]["list"]
                 if v["type"] == "query"]
        assert refs and set(refs) <= {json.dumps(r, sort_keys=True) for r in DS_REFS.values()}
        text = json.dumps(dash)
        assert "127.0.0.1" not in text and "localhost" not in text, name


def test_import_copies_are_grafanas_shared_export_of_the_provisioned_ones():
    """grafana/import/*.json is the provisioned dashboard plus what "Export for sharing
    externally" adds: ``__inputs`` for a Prometheus and a Tempo bound to the data-source
    variables. Grafana's import replaces ``${DS_...}`` with the picked uid; after that the
    variables select the importer's data sources and nothing is left unresolved."""
    provisioned = dashboards()
    for name, doc in dashboards(IMPORT_DIR).items():
        inputs = {i["name"]: i for i in doc["__inputs"]}
        assert {n: i["pluginId"] for n, i in inputs.items()} == {
            "DS_PROMETHEUS": "prometheus", "DS_TEMPO": "tempo"}
        assert all(i["type"] == "datasource" for i in inputs.values())
        assert {r["id"] for r in doc["__requires"]} >= {"grafana", "prometheus", "tempo"}
        assert doc["id"] is None
        # Apart from those, the same dashboard.
        same = {k: v for k, v in doc.items() if not k.startswith("__") and k != "id"}
        same["templating"] = {"list": [{k: v for k, v in var.items() if k != "current"}
                                       for var in doc["templating"]["list"]]}
        assert same == provisioned[name], name
        # Import as Grafana does: each ${INPUT} in any string becomes the picked value.
        picked = {"DS_PROMETHEUS": "their-prom", "DS_TEMPO": "their-tempo"}
        text = json.dumps({k: v for k, v in doc.items() if k != "__inputs"})
        for input_name, uid in picked.items():
            assert f"${{{input_name}}}" in text, f"{name}: {input_name} is never used"
            text = text.replace(f"${{{input_name}}}", uid)
        assert "${DS_" not in text
        imported = json.loads(text)
        current = {v["name"]: v["current"]["value"] for v in imported["templating"]["list"]
                   if v["type"] == "datasource"}
        assert current == {"prometheus": "their-prom", "tempo": "their-tempo"}, name


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


def _imported(doc: dict, picked: dict[str, str]) -> dict:
    """An import copy after Grafana's Import with ``picked`` (input name -> uid)."""
    text = json.dumps({k: v for k, v in doc.items() if k != "__inputs"})
    for input_name, uid in picked.items():
        text = text.replace(f"${{{input_name}}}", uid)
    return json.loads(text)


def _resolve(dash: dict, ref: dict, instances: dict[str, tuple[str, str]]) -> str:
    """What Grafana queries for a target's data source: a ``${var}`` uid is the data-source
    variable's current value, or with none the instance's first data source of the variable's
    type; ``instances`` is uid -> (type, URL) of the Grafana's data sources. A fixed uid the
    Grafana lacks raises KeyError, as the panel would fail there."""
    uid = ref["uid"]
    if uid.startswith("${"):
        (var,) = [v for v in dash["templating"]["list"] if f"${{{v['name']}}}" == uid]
        assert var["type"] == "datasource" and var["query"] == ref["type"], var
        uid = (var.get("current") or {}).get("value") or next(
            u for u, (kind, _url) in instances.items() if kind == var["query"])
    kind, url = instances[uid]
    assert kind == ref["type"], (ref, kind)
    return url


@pytest.mark.skipif(not have_prometheus() and not IN_CI, reason="needs prometheus")
def test_every_dashboard_query_and_rule_is_accepted_by_a_real_prometheus(tmp_path):
    """On an empty Prometheus 2.42 with the shipped rules loaded: each panel's PromQL and each
    query variable, in both the provisioned and the imported form, reaches the Prometheus through
    the data-source variable (a Grafana whose data sources have uids of its own) and parses and
    evaluates (data comes in the vLLM end-to-end test)."""
    queries = prom_queries()
    assert len(queries) >= 15
    assert prom_queries(IMPORT_DIR) == queries
    with prometheus(tmp_path) as url:
        # Someone else's Grafana: other uids, two Prometheus data sources of which ours is first.
        instances = {"their-prom": ("prometheus", url),
                     "their-other-prom": ("prometheus", "http://127.0.0.1:9"),
                     "their-tempo": ("tempo", "http://127.0.0.1:9")}
        forms = {"provisioned": dashboards(),
                 "import": {n: _imported(d, {"DS_PROMETHEUS": "their-prom",
                                             "DS_TEMPO": "their-tempo"})
                            for n, d in dashboards(IMPORT_DIR).items()}}
        ran = 0
        for form, docs in forms.items():
            for dash_name, dash in docs.items():
                for var in dash["templating"]["list"]:
                    if var["type"] != "query":
                        continue
                    base = _resolve(dash, var["datasource"], instances)
                    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"].strip())
                    assert m, var["query"]
                    out = api(base, f"/api/v1/label/{m.group(2)}/values",
                              **{"match[]": substitute(m.group(1))})
                    assert out.get("status") == "success", (form, dash_name, var["name"], out)
                    ran += 1
                for panel in panels(dash):
                    for target in panel.get("targets") or []:
                        if target["datasource"]["type"] != "prometheus":
                            continue
                        base = _resolve(dash, target["datasource"], instances)
                        expr = substitute(target["expr"])
                        out = api(base, "/api/v1/query", query=expr)
                        assert out.get("status") == "success", (form, dash_name, panel["title"],
                                                                expr, out)
                        ran += 1
        assert ran == 2 * (len(queries) + 9), ran  # 3 query variables on each of 3 dashboards
        groups = api(url, "/api/v1/rules")["data"]["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"]}
        assert "OtelTtftWarmupStageRegression" in loaded
        for group in groups:
            for rule in group["rules"]:
                assert rule.get("health") in ("ok", "unknown"), rule
