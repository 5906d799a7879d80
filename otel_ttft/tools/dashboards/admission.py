"""Admission: what the engine looked like when requests arrived, and how long they queued."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from otel_ttft import semconv
from otel_ttft.tools.dashboards.common import (
    SEL,
    STAGE_TIME,
    TTFT,
    new_dashboard,
    prom,
    timeseries_panel,
    traceql_table,
)


def build() -> db.Dashboard:
    return (
        new_dashboard("admission", "otel-ttft / Admission",
                      "Queue depth and KV-cache usage at arrival, failed admissions, preemptions "
                      "and the queue stage's share of TTFT.")
        .with_row(db.Row("At arrival"))
        .with_panel(timeseries_panel(
            "Engine queue depth at arrival",
            "ttft.request.arrival.waiting_requests: requests waiting in the engine queue when the "
            "latest request arrived (per model and process).", "short",
            prom(f"max by (gen_ai_request_model, instance) "
                 f"(ttft_request_arrival_waiting_requests{{{SEL}}})",
                 "{{gen_ai_request_model}} {{instance}}"),
            width=12))
        .with_panel(timeseries_panel(
            "KV-cache usage at arrival",
            "ttft.request.arrival.kv_usage: fraction of KV-cache blocks in use when the latest "
            "request arrived. Near 100 %, admission waits for blocks.", "percentunit",
            prom(f"max by (gen_ai_request_model, instance) "
                 f"(ttft_request_arrival_kv_usage_ratio{{{SEL}}})",
                 "{{gen_ai_request_model}} {{instance}}"),
            width=12))
        .with_row(db.Row("Queue"))
        .with_panel(timeseries_panel(
            "Queue share of server TTFT",
            "Time in the queue stage over server TTFT, 15 min windows. Rising against its 7-day "
            "average is alerted (admission policy: max seqs, KV budget).", "percentunit",
            prom(f"sum by (gen_ai_request_model) (rate({STAGE_TIME}{{ttft_stage=\"queue\", {SEL}}}"
                 f"[15m])) / sum by (gen_ai_request_model) (rate({TTFT}_sum{{{SEL}}}[15m]))",
                 "{{gen_ai_request_model}}"),
            width=12))
        .with_panel(timeseries_panel(
            "Queue time per request, and the TTFT p95 it sits in",
            "Mean time from the engine receiving a request to scheduling it (again after a "
            "preemption before the first token), next to server TTFT p95; its exemplars open "
            "slow requests, whose spans carry their own queue time.", "s",
            prom(f"sum by (gen_ai_request_model) (rate({STAGE_TIME}{{ttft_stage=\"queue\", "
                 f"{SEL}}}[$__rate_interval])) / sum by (gen_ai_request_model) "
                 f"(rate({TTFT}_count{{{SEL}}}[$__rate_interval]))",
                 "queue {{gen_ai_request_model}}", "A"),
            prom(f"histogram_quantile(0.95, sum by (gen_ai_request_model, le) (rate({TTFT}_bucket"
                 f"{{{SEL}}}[$__rate_interval])))",
                 "TTFT p95 {{gen_ai_request_model}}", "B", exemplar=True),
            width=12))
        .with_row(db.Row("Failed admissions and preemptions (Tempo)"))
        .with_panel(traceql_table(
            "Requests with failed admission attempts",
            "Requests whose admission found no free KV blocks at least once "
            "(ttft.request.admission.failed_attempts), with queue depth and KV usage at arrival.",
            f'{{ name = "{semconv.SPAN_REQUEST}" && '
            f'span.{semconv.ATTR_REQUEST_ADMISSION_FAILED} > 0 }} | '
            f'select(span.{semconv.ATTR_REQUEST_ADMISSION_FAILED}, '
            f'span.{semconv.ATTR_REQUEST_ARRIVAL_WAITING}, '
            f'span.{semconv.ATTR_REQUEST_ARRIVAL_KV_USAGE})',
            width=12))
        .with_panel(traceql_table(
            "Preempted requests",
            "Requests preempted before or after their first token (ttft.request.preemptions); the "
            "preempted events on the span say when.",
            f'{{ name = "{semconv.SPAN_REQUEST}" && span.{semconv.ATTR_REQUEST_PREEMPTIONS} > 0 }}'
            f' | select(span.{semconv.ATTR_REQUEST_PREEMPTIONS}, span.{semconv.ATTR_STAGE})',
            width=12))
    )
