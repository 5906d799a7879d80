"""A real Prometheus (Debian's 2.42) for tests: started on 127.0.0.1 with a temp dir and a free
port, optionally on backfilled blocks, killed after; plus the dashboards' queries."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from otel_ttft.tools.replay.server import free_port

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "collector-config" / "rules"
STUCK_RULE_FILE = RULES_DIR / "otel-ttft-stuck.yml"
DASHBOARDS_DIR = ROOT / "grafana" / "dashboards"
IMPORT_DIR = ROOT / "grafana" / "import"  # the same dashboards with __inputs, for Grafana's Import
# What Grafana substitutes before a query reaches Prometheus ("All" is ".*").
GRAFANA_VARS = {"$service": ".*", "$instance": ".*", "$model": ".*",
                "$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def have_prometheus() -> bool:
    return bool(shutil.which("prometheus") and shutil.which("promtool"))


def backfill(openmetrics: bytes, data_dir: Path, work: Path, name: str) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into Prometheus's data dir."""
    src = work / f"{name}.om"
    src.write_bytes(openmetrics)
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(src),
                          str(data_dir)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@contextmanager
def prometheus(work: Path, *, rules: bool = True, data_dir: Path | None = None,
               scrape_targets: tuple[str, ...] = (), config: dict | None = None) -> Iterator[str]:
    """Prometheus on 127.0.0.1:<free port> loading the shipped rules (or run on ``config``, a
    whole prometheus.yml); yields its base URL."""
    data_dir = data_dir or work / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else {
        "global": {"scrape_interval": "1s", "evaluation_interval": "15s"},
        "rule_files": [str(RULES_DIR / "*.yml")] if rules else [],
        "scrape_configs": [{"job_name": "otel-ttft", "honor_labels": True,
                            "static_configs": [{"targets": list(scrape_targets)}]}]
        if scrape_targets else []}
    (work / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
    port = free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={data_dir}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=30d", "--web.enable-lifecycle"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def api(url: str, path: str, **params: object) -> dict:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    req = urllib.request.Request(f"{url}{path}?{query}" if query else f"{url}{path}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422: the error body says why
        return json.loads(exc.read() or b"{}") | {"http_status": exc.code}


def dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def prom_queries(directory: Path = DASHBOARDS_DIR) -> list[tuple[str, int, str, str]]:
    """(dashboard file, panel id, panel title, PromQL with Grafana variables substituted)."""
    out = []
    for name, dash in dashboards(directory).items():
        for panel in panels(dash):
            for target in panel.get("targets") or []:
                if (target.get("datasource") or {}).get("type") == "prometheus":
                    out.append((name, panel["id"], panel["title"], substitute(target["expr"])))
    return out


def variable_queries(directory: Path = DASHBOARDS_DIR) -> list[tuple[str, str, str]]:
    """(variable, series selector, label) of every ``label_values(selector, label)`` variable,
    Grafana variables substituted, one per distinct query (data-source variables list data
    sources, not series: left out)."""
    out = set()
    for dash in dashboards(directory).values():
        for var in dash["templating"]["list"]:
            if var["type"] == "datasource":
                continue
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"].strip())
            assert m, var["query"]
            out.add((var["name"], substitute(m.group(1)), m.group(2)))
    return sorted(out)


def substitute(expr: str) -> str:
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARS[var])
    return expr


def traceql_queries() -> list[str]:
    return [t["query"] for dash in dashboards().values() for p in panels(dash)
            for t in p.get("targets") or []
            if (t.get("datasource") or {}).get("type") == "tempo"]


_NAME = re.compile(r'\bname\s*=~?\s*"([^"]+)"')
_ATTR = re.compile(r"\b(?:span|resource)\.([A-Za-z_][\w.]*)")


def traceql_names_and_attributes() -> tuple[set[str], set[str]]:
    names: set[str] = set()
    attrs: set[str] = set()
    for query in traceql_queries():
        names.update(_NAME.findall(query))
        attrs.update(_ATTR.findall(query))
    return names, attrs


def traceql_stage_values() -> set[str]:
    """Values compared with span.ttft.stage (= or =~ alternatives)."""
    out: set[str] = set()
    for query in traceql_queries():
        for value in re.findall(r'span\.ttft\.stage\s*=~?\s*"([^"]+)"', query):
            out.update(value.split("|"))
    return out


def wait_for_alerts(url: str, predicate, timeout_s: float = 150) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        alerts = api(url, "/api/v1/alerts")["data"]["alerts"]
        if predicate(alerts) or time.monotonic() > deadline:
            return alerts
        time.sleep(2)


os.environ.setdefault("NO_PROXY", "127.0.0.1")
