"""Activations: every start, wake-up or adapter load, with its stages."""

from __future__ import annotations

import json
import urllib.parse

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.models import dashboard as dm

from otel_ttft import semconv
from otel_ttft.tools.dashboards.common import (
    PROMETHEUS,
    SEL,
    new_dashboard,
    prom,
    timeseries_panel,
    traceql_table,
)
from otel_ttft.tools.prom import naming

LAST = "ttft_activation_stage_last_duration_seconds"
VERDICT = naming.metric_name(semconv.METRIC_ACTIVATION_VERDICT, "s", naming.GAUGE)
TRACE_ID = naming.label_name(semconv.ATTR_ACTIVATION_TRACE_ID)
# The verdict's labels, in the order the table shows them.
VERDICT_LABELS = ("gen_ai_request_model", "instance", TRACE_ID, *(
    naming.label_name(k) for k in (
        semconv.ATTR_VERDICT_OUTCOME, semconv.ATTR_STAGE, semconv.ATTR_VERDICT_SUBSTAGE,
        semconv.ATTR_VERDICT_RECOMMENDATION, semconv.ATTR_VERDICT_CHANGE,
        semconv.ATTR_VERDICT_BASELINE, semconv.ATTR_VERDICT_PHASE)))
# Grafana Explore on the dashboard's Tempo (the ``tempo`` variable, not a fixed uid) with the row's
# trace id (the table cell's raw value); both are left unquoted for Grafana to interpolate.
TRACE_LINK = "/explore?left=" + urllib.parse.quote(json.dumps(
    {"datasource": "TEMPO_UID", "queries": [{"refId": "A", "queryType": "traceql",
                                             "query": "TRACE_ID"}]}, separators=(",", ":")),
    safe="").replace("TEMPO_UID", "${tempo}").replace("TRACE_ID", "${__value.raw}")
READ = "ttft_load_read_throughput_gigabytes_per_second"
FORECAST = naming.metric_name(semconv.METRIC_SWITCH_FORECAST, "s", naming.GAUGE)
BOUND = naming.label_name(semconv.ATTR_FORECAST_BOUND)
# Leaf stages: they do not contain one another, so stacking them does not count time twice.
LEAF_STAGES = "|".join((
    semconv.STAGE_SWITCH_SLEEP, semconv.STAGE_LOAD_INIT, semconv.STAGE_LOAD_READ,
    semconv.STAGE_LOAD_PROCESS, semconv.STAGE_LOAD_H2D, semconv.STAGE_WARMUP_PROCESS_START,
    semconv.STAGE_WARMUP_FRONTEND, semconv.STAGE_WARMUP_DEVICE_INIT, semconv.STAGE_WARMUP_PROFILE,
    semconv.STAGE_WARMUP_GRAPH_CAPTURE, semconv.STAGE_WARMUP_KV_ALLOC,
)).replace(".", "\\\\.")


def why_slow_panel() -> table_panel.Panel:
    """The live verdict of each model's latest start, one row per server process."""
    expr = (f"max by ({', '.join(VERDICT_LABELS)}) ({VERDICT}{{{SEL}}})")
    return (table_panel.Panel().title("Why the last switch was slow")
            .description(
                "Each vLLM API server judges its own start against the earlier starts of its "
                "model and configuration on its host (ttft.activation.verdict; the rule "
                "`otel-ttft analyze` applies): the earliest stage that grew, by how much (the "
                "value), and the fix in the running vLLM's own flags and environment variables. "
                "no-baseline: a first start; thin: fewer than 3 earlier starts, judged by the "
                "alert thresholds. The trace id opens the activation in Tempo; the server's log "
                "has the verdict in words.")
            .unit("s").datasource(PROMETHEUS).span(24).height(7)
            .with_target(prom(expr, instant=True, table=True))
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True, "__name__": True, "job": True},
                "indexByName": {name: i for i, name in enumerate((*VERDICT_LABELS, "Value"))},
                "renameByName": {"Value": "increase", TRACE_ID: "trace"}}))
            .override_by_name(TRACE_ID, [dm.DynamicConfigValue(id_val="links", value=[
                {"title": "Open the activation trace in Tempo", "url": TRACE_LINK}])]))


def forecast_panel() -> table_panel.Panel:
    """Each model's forecast, stage by stage, as the servers of its host read it now."""
    expr = (f"max by (gen_ai_request_model, ttft_stage) "
            f"({FORECAST}{{{BOUND}=\"expected\", {SEL}}})")
    return (table_panel.Panel().title("Forecast: each model's next first token, per stage")
            .description(
                "ttft.switch.forecast: what the first token of each model of the host would cost "
                "if a request for it arrived now (the reporting server leaving first), from its "
                "earlier activations there and the conditions read now (page cache of its "
                "checkpoint, compile cache); stage total is the whole TTFT. A model never "
                "started on the host has no row. `otel-ttft forecast` says the basis and the "
                "range. Evict the model that is cheapest to bring back.")
            .unit("s").datasource(PROMETHEUS).span(12).height(9)
            .with_target(prom(expr, instant=True, table=True))
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True}, "renameByName": {"Value": "forecast"}})))


def last_stages_panel() -> table_panel.Panel:
    """The last activation's measured leaf stages per model: what the forecast is checked by."""
    expr = (f"max by (gen_ai_request_model, ttft_stage) "
            f"({LAST}{{ttft_stage=~\"{LEAF_STAGES}\", {SEL}}})")
    return (table_panel.Panel().title("The last switch's actual stages, per model")
            .description(
                "ttft.activation.stage.last_duration: the longest span of each leaf stage in "
                "the latest activation of each model, beside its forecast.")
            .unit("s").datasource(PROMETHEUS).span(12).height(9)
            .with_target(prom(expr, instant=True, table=True))
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True}, "renameByName": {"Value": "actual"}})))


def build() -> db.Dashboard:
    return (
        new_dashboard("activations", "otel-ttft / Activations",
                      "Engine activations (start, wake-up, adapter load): the stages of the latest "
                      "one per model, checkpoint reads, compile cache, graph capture, and the "
                      "activation traces in Tempo.")
        .with_row(db.Row("Why the last switch was slow"))
        .with_panel(why_slow_panel())
        .with_panel(traceql_table(
            "Verdicts of recent activations, in words",
            "The live verdicts of each activation (ttft.verdict.summary, as the server "
            "logged it, with the change it names), on its vllm.activation.verdict child spans: "
            "one at ready, one once the activation's cold requests are done.",
            f'{{ name = "{semconv.SPAN_ACTIVATION_VERDICT}" }} | '
            f'select(span.{semconv.ATTR_VERDICT_OUTCOME}, '
            f'span.{semconv.ATTR_VERDICT_SUMMARY})', limit=20, height=7))
        .with_row(db.Row("Before the next switch: the forecast"))
        .with_panel(forecast_panel())
        .with_panel(last_stages_panel())
        .with_row(db.Row("Stages of each activation"))
        .with_panel(timeseries_panel(
            "Activation stages per model (stacked, latest activation of each process)",
            "ttft.activation.stage.last_duration: the longest span of each leaf stage in the "
            "latest activation of each process, stacked per model. A new activation shows as a "
            "step; the warm-up regression alert compares it with the 7-day median. Stages of "
            "different processes overlap in time, so the stack can exceed the wall time.",
            "s",
            prom(f"max by (gen_ai_request_model, ttft_stage) "
                 f"({LAST}{{ttft_stage=~\"{LEAF_STAGES}\", {SEL}}})",
                 "{{gen_ai_request_model}} {{ttft_stage}}"),
            stacked=True, bars=True, width=16, height=10))
        .with_panel(timeseries_panel(
            "Stage vs. its 7-day median (alert input)",
            "Latest value of each stage over the median the warm-up alert compares it with "
            "(1 = usual; the alert fires above 2 and 10 s more, see collector-config/rules).",
            "suffix:×",
            prom(f"max by (gen_ai_request_model, ttft_stage) ({LAST}{{{SEL}}}) / on "
                 f"(gen_ai_request_model, ttft_stage) quantile_over_time(0.5, "
                 f"(max by (gen_ai_request_model, ttft_stage) ({LAST}{{{SEL}}}))[7d:5m] "
                 f"offset 1h)", "{{gen_ai_request_model}} {{ttft_stage}}"),
            width=8, height=10))
        .with_row(db.Row("Load"))
        .with_panel(timeseries_panel(
            "Checkpoint read GB/s per process",
            "Mean per-shard read throughput of each process's activation "
            "(ttft.load.read.throughput sum / count). A collapse against the usual level "
            "(storage, cold page cache, network file system) is alerted.",
            "GBs",
            prom(f"sum by (gen_ai_request_model, instance) ({READ}_sum{{{SEL}}}) / "
                 f"sum by (gen_ai_request_model, instance) ({READ}_count{{{SEL}}})",
                 "{{gen_ai_request_model}} {{instance}}"),
            width=8))
        .with_panel(timeseries_panel(
            "Checkpoint bytes read per process",
            "ttft.load.read.bytes: checkpoint bytes read by each process's latest load.", "bytes",
            prom(f"max by (gen_ai_request_model, instance) "
                 f"(ttft_load_read_bytes_total{{{SEL}}})", "{{gen_ai_request_model}} {{instance}}"),
            width=8))
        .with_panel(traceql_table(
            "Shard reads: page-cache residency and GB/s",
            "Each checkpoint shard read (Read checkpoint shard, stage load.read) with the share of "
            "the file already in the page cache before the read (0 = cold read from storage) and "
            "its throughput.",
            f'{{ name = "{semconv.SPAN_SHARD_READ}" }} | '
            f'select(span.{semconv.ATTR_PAGE_CACHE_RESIDENT}, span.{semconv.ATTR_READ_GB_PER_S})',
            width=8, height=8))
        .with_row(db.Row("Warm-up"))
        .with_panel(timeseries_panel(
            "Compile cache hit ratio per model",
            "Share of torch.compile spans of the latest activation that loaded their artifacts "
            "from the cache (ttft.activation.compile.cache_hit_ratio). 0 where hits were the norm "
            "is alerted.",
            "percentunit",
            prom(f"min by (gen_ai_request_model) "
                 f"(ttft_activation_compile_cache_hit_ratio{{{SEL}}})", "{{gen_ai_request_model}}"),
            width=8))
        .with_panel(timeseries_panel(
            "Compile and graph capture time",
            "warmup.compile (torch.compile) and warmup.graph_capture (CUDA graphs; GPU only) in "
            "the latest activation.", "s",
            prom(f"max by (gen_ai_request_model, ttft_stage) ({LAST}{{ttft_stage=~\""
                 f"{semconv.STAGE_WARMUP_COMPILE}|{semconv.STAGE_WARMUP_GRAPH_CAPTURE}\"".replace(
                     ".", "\\\\.") + f", {SEL}}})", "{{gen_ai_request_model}} {{ttft_stage}}"),
            width=8))
        .with_panel(traceql_table(
            "KV cache allocations",
            "Allocate KV cache spans (stage warmup.kv_alloc): KV bytes, blocks and token capacity "
            "of each activation.",
            f'{{ name = "{semconv.SPAN_KV_ALLOC}" }} | select(span.{semconv.ATTR_KV_BYTES}, '
            f'span.{semconv.ATTR_KV_BLOCKS}, span.{semconv.ATTR_KV_TOKEN_CAPACITY})',
            width=8, height=8))
        .with_row(db.Row("Activation traces (Tempo)"))
        .with_panel(traceql_table(
            "Recent activations",
            "One row per vllm.activation trace (kind: start, wake, adapter); click the trace id "
            "for the waterfall across the API server, EngineCore and worker processes.",
            f'{{ name = "{semconv.SPAN_ACTIVATION}" }} | '
            f'select(span.{semconv.ATTR_ACTIVATION_KIND})',
            limit=50))
    )
