"""Shared pieces: data sources, variables, query and panel helpers."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, tempo, timeseries
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import tempo as tm

from otel_ttft import semconv
from otel_ttft.tools.prom import naming

# Every panel, target and query variable names its data source through a data-source variable
# (Grafana's convention for a dashboard shared between instances): any Grafana's own Prometheus
# and Tempo can be picked, whatever their uids. name -> (plugin type, label, import input).
DATASOURCE_VARIABLES = {"prometheus": ("prometheus", "Prometheus", "DS_PROMETHEUS"),
                        "tempo": ("tempo", "Tempo", "DS_TEMPO")}
PROMETHEUS = dm.DataSourceRef(type_val="prometheus", uid="${prometheus}")
TEMPO = dm.DataSourceRef(type_val="tempo", uid="${tempo}")
# Label selector every Prometheus query carries (dashboard variables).
SEL = 'job=~"$service", instance=~"$instance", gen_ai_request_model=~"$model"'
TAGS = ["otel-ttft", "vllm"]
# The Grafana of the SDK's models (the `dashboards` extra pins it): __requires of the import copies.
GRAFANA_VERSION = "11.6.0"
PANEL_NAMES = {"table": "Table", "timeseries": "Time series"}
UIDS = {"ttft": "otel-ttft-ttft", "activations": "otel-ttft-activations",
        "admission": "otel-ttft-admission"}
# Our request metrics as the Collector's Prometheus exporter names them.
TTFT = naming.metric_name(semconv.METRIC_SERVER_TTFT, "s", naming.HISTOGRAM)
STAGE_TIME = naming.metric_name(semconv.METRIC_REQUEST_STAGE_TIME, "s", naming.COUNTER)


def _var(name: str, label: str, query: str, description: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).description(description)
            .datasource(PROMETHEUS).query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


def datasource_variables() -> list[db.DatasourceVariable]:
    """``prometheus`` and ``tempo``: with no current value Grafana picks the instance's default
    data source of the type (or the first one); the import copies set it from ``__inputs``."""
    return [db.DatasourceVariable(name).label(label).type(plugin)
            .description(f"The {label} data source otel-ttft's telemetry is in")
            for name, (plugin, label, _input) in DATASOURCE_VARIABLES.items()]


def variables() -> list[db.DatasourceVariable | db.QueryVariable]:
    """The data sources, then service (Prometheus ``job`` = OTel ``service.name``), instance
    (``service.instance.id``: one vLLM process), model (``gen_ai.request.model``)."""
    return [
        *datasource_variables(),
        _var("service", "service", "label_values(target_info, job)",
             "OTEL_SERVICE_NAME of the vLLM processes (Prometheus job)"),
        _var("instance", "instance", 'label_values(target_info{job=~"$service"}, instance)',
             "One vLLM process (service.instance.id)"),
        _var("model", "model",
             'label_values({__name__=~"gen_ai_server_time_to_first_token_seconds_count|'
             'ttft_activation_stage_last_duration_seconds", job=~"$service"}, '
             'gen_ai_request_model)',
             "Served model (gen_ai.request.model)"),
    ]


def prom(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False,
         exemplar: bool = False, table: bool = False) -> prometheus.Dataquery:
    q = (prometheus.Dataquery().expr(expr).ref_id(ref).datasource(PROMETHEUS)
         .legend_format(legend or "__auto"))
    q = q.instant() if instant else q.range()
    if exemplar:
        q = q.exemplar(True)
    if table:
        q = q.format(pm.PromQueryFormat.TABLE)
    return q


def traceql(query: str, limit: int = 20, spans_per_trace: int = 3,
            table_type: tm.SearchTableType = tm.SearchTableType.TRACES) -> tempo.TempoQuery:
    return (tempo.TempoQuery().ref_id("A").datasource(TEMPO).query_type("traceql")
            .query(query).limit(limit).spss(spans_per_trace).table_type(table_type))


def legend() -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))


def timeseries_panel(title: str, description: str, unit: str, *targets: Any,
                     stacked: bool = False, bars: bool = False, width: int = 12,
                     height: int = 8) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(description).unit(unit)
         .datasource(PROMETHEUS).span(width).height(height).legend(legend()))
    for t in targets:
        p = p.with_target(t)
    if stacked:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(60)
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    return p


def traceql_table(title: str, description: str, query: str, *, limit: int = 20,
                  width: int = 24, height: int = 9, slowest_first: bool = False,
                  time_from: str | None = None) -> table_panel.Panel:
    """Tempo search results; the trace and span duration columns are in ms, other numbers as
    they are. ``slowest_first``: rows sorted by duration; ``time_from``: e.g. ``1h`` whatever the
    dashboard's range."""
    p = table_panel.Panel()
    if slowest_first:
        p = p.sort_by([cb.TableSortByFieldState().display_name("Duration").desc(True)])
    if time_from:
        p = p.time_from(time_from)
    return (p.title(title).description(description).unit("none")
            .datasource(TEMPO).with_target(traceql(query, limit)).span(width).height(height)
            .override_by_regexp("^(traceDuration|spanDuration|duration)$",
                                [dm.DynamicConfigValue(id_val="unit", value="ms")]))


def to_model(dashboard: db.Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model; panels numbered 1..n."""
    model = dashboard.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.loads(JSONEncoder().encode(model))


def dump(model: dict[str, Any]) -> str:
    """Stable JSON (sorted keys), as committed under grafana/."""
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def importable(model: dict[str, Any]) -> dict[str, Any]:
    """Grafana's "Export for sharing externally" shape (grafana/import/): ``__inputs`` ask the
    importer for a Prometheus and a Tempo, which become the data-source variables' current value,
    as Grafana's own exporter writes it; panels keep naming the variables, so the data sources
    can still be switched after import. Not provisioned: provisioning does not read ``__inputs``."""
    out = dict(model, id=None)
    out["templating"] = {"list": []}
    for var in model["templating"]["list"]:
        if var["type"] == "datasource":
            plugin, label, name = DATASOURCE_VARIABLES[var["name"]]
            var = dict(var, current={"selected": True, "text": "", "value": f"${{{name}}}"})
        out["templating"]["list"].append(var)
    out["__inputs"] = [
        {"name": name, "label": label, "description": f"The {label} data source otel-ttft's "
         "telemetry is in", "type": "datasource", "pluginId": plugin, "pluginName": label}
        for plugin, label, name in DATASOURCE_VARIABLES.values()]
    panel_types = sorted({p["type"] for p in _all_panels(model) if p["type"] != "row"})
    out["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
        *({"type": "datasource", "id": plugin, "name": label, "version": "1.0.0"}
          for plugin, label, _name in DATASOURCE_VARIABLES.values()),
        *({"type": "panel", "id": t, "name": PANEL_NAMES.get(t, t), "version": ""}
          for t in panel_types)]
    out["__elements"] = {}
    return out


def _all_panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    top = model.get("panels") or []
    return [*top, *(p for row in top for p in row.get("panels") or [])]


def new_dashboard(key: str, title: str, description: str) -> db.Dashboard:
    return (db.Dashboard(title).uid(UIDS[key]).description(description).tags(TAGS)
            .readonly().time("now-6h", "now").refresh("1m").timezone("browser")
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .variables(variables())
            .link(db.DashboardLink("otel-ttft").type(dm.DashboardLinkType.DASHBOARDS)
                  .tags(["otel-ttft"]).as_dropdown(True).include_vars(True)
                  .keep_time(True)))
