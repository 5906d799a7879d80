"""Grafana dashboards as code (grafana-foundation-sdk, Grafana 11 models).

``python -m otel_ttft.tools.dashboards`` writes ``grafana/dashboards/*.json``; the JSON is
committed and a test fails when regenerating would change it. Every query uses the provisioned
data-source uids (``prometheus``, ``tempo``) and the metric names the Collector's Prometheus
exporter produces.
"""
