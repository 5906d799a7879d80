"""Static checks of the observability-stack configs: they are only exercised when someone runs the
stack, so the mistakes that cost an evening (a pipeline naming an undefined exporter, a port open
to the network, a dashboard pointing at a missing data source) are caught here instead."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
COLLECTOR_DIR = ROOT / "collector-config"
GRAFANA_DIR = ROOT / "grafana"
YAML_FILES = sorted(
    p for d in (COLLECTOR_DIR, GRAFANA_DIR) for p in d.rglob("*") if p.suffix in {".yaml", ".yml"}
)
# Grafana's built-in pseudo data sources, referable without being provisioned.
BUILTIN_DATASOURCE_UIDS = {"grafana", "-- Grafana --", "-- Mixed --", "-- Dashboard --"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_yaml_files_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in YAML_FILES}
    assert {
        "collector-config/otelcol-config.yaml",
        "collector-config/tempo.yaml",
        "collector-config/prometheus.yml",
        "collector-config/docker-compose.yaml",
        "grafana/provisioning/datasources/datasources.yaml",
        "grafana/provisioning/dashboards/dashboards.yaml",
    } <= names


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_yaml_parses(path: Path) -> None:
    assert isinstance(load(path), dict), f"{path} is not a YAML mapping"


# --- collector --------------------------------------------------------------------------------


def test_collector_pipelines_reference_defined_components() -> None:
    cfg = load(COLLECTOR_DIR / "otelcol-config.yaml")
    pipelines = cfg["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            defined = set(cfg.get(kind) or {})
            used = pipeline.get(kind) or []
            if kind != "processors":
                assert used, f"pipeline {name} has no {kind}"
            undefined = set(used) - defined
            assert not undefined, f"pipeline {name} uses undefined {kind}: {sorted(undefined)}"
    for ext in cfg["service"].get("extensions") or []:
        assert ext in (cfg.get("extensions") or {}), f"undefined extension {ext}"


def test_collector_exports_traces_to_tempo_and_metrics_to_prometheus() -> None:
    cfg = load(COLLECTOR_DIR / "otelcol-config.yaml")
    exporters = cfg["exporters"]
    pipelines = cfg["service"]["pipelines"]

    def of_type(names: list[str], type_: str) -> list[str]:
        return [n for n in names if n.split("/", 1)[0] == type_]

    tempo = of_type(pipelines["traces"]["exporters"], "otlp_grpc") + of_type(
        pipelines["traces"]["exporters"], "otlp"
    )
    assert tempo, "traces pipeline does not export OTLP"
    assert any(exporters[n]["endpoint"].startswith("tempo:") for n in tempo)

    prom = of_type(pipelines["metrics"]["exporters"], "prometheus")
    assert prom, "metrics pipeline has no prometheus exporter"
    prom_cfg = exporters[prom[0]]
    assert prom_cfg["resource_to_telemetry_conversion"]["enabled"] is True
    port = prom_cfg["endpoint"].rsplit(":", 1)[1]
    scraped = load(COLLECTOR_DIR / "prometheus.yml")["scrape_configs"]
    targets = [t for job in scraped for sc in job.get("static_configs", []) for t in sc["targets"]]
    assert any(t.endswith(f":{port}") for t in targets), f"prometheus does not scrape :{port}"


def test_prometheus_loads_rule_files() -> None:
    cfg = load(COLLECTOR_DIR / "prometheus.yml")
    assert "/etc/prometheus/rules/*.yml" in cfg["rule_files"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_passes_promtool() -> None:
    out = subprocess.run(
        ["promtool", "check", "config", str(COLLECTOR_DIR / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- compose ----------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return load(COLLECTOR_DIR / "docker-compose.yaml")


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = _compose()["services"]
    published = 0
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            if isinstance(port, dict):  # long syntax
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+(/(tcp|udp))?", str(port)), (
                    f"{name} publishes {port!r} beyond 127.0.0.1"
                )
            published += 1
        assert svc.get("network_mode") != "host", f"{name} uses the host network"
    assert published, "compose publishes no ports at all"


def test_compose_has_the_stack_and_pins_images() -> None:
    services = _compose()["services"]
    images = {name: svc.get("image", "") for name, svc in services.items()}
    for needed in ("otel-collector", "tempo", "prometheus", "grafana"):
        assert needed in services
    for name, image in images.items():
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image ({image})"


def test_compose_bind_mounts_exist() -> None:
    for name, svc in _compose()["services"].items():
        for vol in svc.get("volumes") or []:
            source = vol.split(":", 1)[0]
            if source.startswith("."):
                assert (COLLECTOR_DIR / source).exists(), f"{name} mounts missing {source}"


def test_grafana_mounts_provisioning_and_dashboards() -> None:
    vols = _compose()["services"]["grafana"]["volumes"]
    mounts = dict(v.split(":")[:2] for v in vols)
    assert mounts.get("../grafana/provisioning") == "/etc/grafana/provisioning"
    provider_paths = {
        p["options"]["path"]
        for p in load(GRAFANA_DIR / "provisioning/dashboards/dashboards.yaml")["providers"]
        if p.get("type", "file") == "file"
    }
    assert provider_paths, "no file dashboard provider"
    assert provider_paths <= {mounts.get("../grafana/dashboards")}


# --- grafana data sources ---------------------------------------------------------------------


def _datasource_uids() -> set[str]:
    uids: set[str] = set()
    for path in sorted((GRAFANA_DIR / "provisioning/datasources").glob("*.y*ml")):
        for ds in load(path).get("datasources") or []:
            assert ds.get("uid"), f"{path.name}: data source {ds.get('name')} has no fixed uid"
            uids.add(ds["uid"])
    return uids


def test_datasources_have_expected_uids() -> None:
    assert {"tempo", "prometheus"} <= _datasource_uids()


def _referenced_uids(node: Any) -> Iterator[str]:
    """Every data source uid a provisioning file or dashboard refers to."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasourceUid" and isinstance(value, str):
                yield value
            elif key == "datasource" and isinstance(value, dict) and isinstance(
                value.get("uid"), str
            ):
                yield value["uid"]
            yield from _referenced_uids(value)
    elif isinstance(node, list):
        for item in node:
            yield from _referenced_uids(item)


def test_referenced_datasource_uids_exist() -> None:
    defined = _datasource_uids() | BUILTIN_DATASOURCE_UIDS
    documents: list[tuple[Path, Any]] = [
        (p, load(p)) for p in YAML_FILES if GRAFANA_DIR in p.parents
    ]
    documents += [(p, json.loads(p.read_text())) for p in sorted(GRAFANA_DIR.rglob("*.json"))]
    checked = 0
    for path, doc in documents:
        for uid in _referenced_uids(doc):
            if "$" in uid:  # a dashboard variable, resolved at view time
                continue
            checked += 1
            assert uid in defined, f"{path.relative_to(ROOT)} refers to unknown data source {uid!r}"
    assert checked, "no data source references found (tracesToMetrics/serviceMap expected)"
