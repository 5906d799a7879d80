"""Grafana dashboards as code (grafana-foundation-sdk, Grafana 11 models).

``python -m otel_ttft.tools.dashboards`` writes ``grafana/dashboards/*.json`` (provisioned) and
``grafana/import/*.json`` (the same dashboards with ``__inputs``, for Grafana's Import); the JSON
is committed and a test fails when regenerating would change it. Every panel, target and query
variable names its data source through the ``prometheus`` and ``tempo`` data-source variables,
never a fixed uid, so the dashboards work in any Grafana; queries use the metric names the
Collector's Prometheus exporter produces.
"""
