"""TTFT breakdown: the first token per model, cold vs. warm, and which stage the time goes to."""

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
from otel_ttft.tools.prom import naming

# The replay client's TTFT, as the Collector's Prometheus exporter names it. The replay is its own
# service (job), apart from the vLLM processes that $service / $instance pick.
CLIENT_TTFT = naming.metric_name(semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, "s", naming.HISTOGRAM)
CLIENT_SEL = f'job="{semconv.REPLAY_SERVICE_NAME}", gen_ai_request_model=~"$model"'
# Stages inside server TTFT (first_decode is after it).
TTFT_STAGES = "|".join((semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL))


def _quantile(q: float, ref: str, metric: str = TTFT, sel: str = SEL) -> object:
    return prom(
        f"histogram_quantile({q}, sum by (gen_ai_request_model, ttft_request_cold, le) "
        f"(rate({metric}_bucket{{{sel}}}[$__rate_interval])))",
        f"p{int(q * 100)} {{{{gen_ai_request_model}}}} cold={{{{ttft_request_cold}}}}", ref,
        exemplar=True)


def _client_quantile(q: float, ref: str) -> object:
    return _quantile(q, ref, CLIENT_TTFT, CLIENT_SEL)


def build() -> db.Dashboard:
    return (
        new_dashboard("ttft", "otel-ttft / TTFT breakdown",
                      "Server and client (replay) time to first token per model, cold vs. warm, "
                      "and the share of each stage (frontend, queue, prefill). Exemplars open the "
                      "request trace in Tempo.")
        .with_row(db.Row("Time to first token"))
        .with_panel(timeseries_panel(
            "Server TTFT p50 / p95 / p99 by model, cold vs. warm",
            "gen_ai.server.time_to_first_token: request arrival to first token handed to HTTP. "
            "cold=true: the first requests after an activation (OTEL_TTFT_COLD_REQUESTS) or a "
            "request that waited on warm-up work. Exemplar dots open the request's trace.",
            "s", _quantile(0.5, "A"), _quantile(0.95, "B"), _quantile(0.99, "C"), width=12))
        .with_panel(timeseries_panel(
            "Client TTFT p50 / p95 / p99 by model, cold vs. warm (replay)",
            "gen_ai.client.operation.time_to_first_chunk from otel-ttft replay: request made to "
            "first content chunk, as the user lives it (a switch or cold start it waited for, "
            "the network and the server TTFT). cold=true: the request waited for a switch or a "
            "cold start. The gap to the server TTFT is time outside the server's llm_request. "
            "Exemplar dots open the replay.request trace.",
            "s", _client_quantile(0.5, "A"), _client_quantile(0.95, "B"),
            _client_quantile(0.99, "C"), width=12))
        .with_panel(timeseries_panel(
            "Cold requests: p95 TTFT of live processes",
            "Cold requests are few (the first after each activation), so this reads the "
            "cumulative histogram of each live process instead of a rate over empty windows; the "
            "cold-TTFT alert uses the same expression.",
            "s",
            prom(f"histogram_quantile(0.95, sum by (gen_ai_request_model, le) "
                 f"({TTFT}_bucket{{ttft_request_cold=\"true\", {SEL}}}))",
                 "{{gen_ai_request_model}}"),
            width=8))
        .with_panel(timeseries_panel(
            "Requests per second by model",
            "Rate of requests that reached a first token.", "reqps",
            prom(f"sum by (gen_ai_request_model, ttft_request_cold) "
                 f"(rate({TTFT}_count{{{SEL}}}[$__rate_interval]))",
                 "{{gen_ai_request_model}} cold={{ttft_request_cold}}"),
            width=8))
        .with_panel(timeseries_panel(
            "Mean server TTFT by model",
            "Sum of TTFT over count, per model: the level the stage shares below divide up.",
            "s",
            prom(f"sum by (gen_ai_request_model) (rate({TTFT}_sum{{{SEL}}}[$__rate_interval])) "
                 f"/ sum by (gen_ai_request_model) (rate({TTFT}_count{{{SEL}}}[$__rate_interval]))",
                 "{{gen_ai_request_model}}"),
            width=8))
        .with_row(db.Row("Where the time goes"))
        .with_panel(timeseries_panel(
            "Stage share of server TTFT per model (stacked)",
            "ttft.request.stage.time per stage over the summed server TTFT: the stages tile "
            "TTFT, so the stack reaches 100 %. The largest band is the stage to fix (docs: "
            "The stages).",
            "percentunit",
            prom(f"sum by (gen_ai_request_model, ttft_stage) "
                 f"(rate({STAGE_TIME}{{ttft_stage=~\"{TTFT_STAGES}\", {SEL}}}[$__rate_interval])) "
                 f"/ on (gen_ai_request_model) group_left sum by (gen_ai_request_model) "
                 f"(rate({TTFT}_sum{{{SEL}}}[$__rate_interval]))",
                 "{{gen_ai_request_model}} {{ttft_stage}}"),
            stacked=True, width=12))
        .with_panel(timeseries_panel(
            "Time per request by stage, cold vs. warm",
            "Mean time one request spends in each stage (first_decode: first to second token, "
            "outside TTFT): stage time over the number of first tokens. A slow request's own "
            "stages are on its span (table below).", "s",
            prom(f"sum by (ttft_stage, ttft_request_cold) "
                 f"(rate({STAGE_TIME}{{{SEL}}}[$__rate_interval])) "
                 f"/ on (ttft_request_cold) group_left sum by (ttft_request_cold) "
                 f"(rate({TTFT}_count{{{SEL}}}[$__rate_interval]))",
                 "{{ttft_stage}} cold={{ttft_request_cold}}"),
            width=12))
        .with_row(db.Row("Slowest first tokens (Tempo)"))
        .with_panel(traceql_table(
            "Slowest first tokens of the last hour, with their stage spans",
            "Request traces of the last hour, slowest first; each row expands to the request's "
            "stage spans (ttft.stage) with their durations, the longest being the dominant "
            "stage. Click a trace id for the waterfall.",
            f'{{ name = "{semconv.SPAN_REQUEST}" }} >> '
            f'{{ span.ttft.stage =~ "{TTFT_STAGES}" }} | select(span.ttft.stage)',
            limit=50, slowest_first=True, time_from="1h"))
    )
