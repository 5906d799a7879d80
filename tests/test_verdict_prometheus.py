"""The live verdict in a real Prometheus (Debian's 2.42) with the shipped rules: backfilled
``ttft_activation_verdict_seconds`` series of three servers (one slower than its host's earlier
starts, one first start, one within the noise) give the "Why the last switch was slow" panel its
rows and fire ``OtelTtftActivationSlowerThanUsual`` for the slow one only, with the fix."""

from __future__ import annotations

import time

import pytest

from otel_ttft import semconv
from otel_ttft.tools.prom import naming
from tests.prom_helpers import (
    api,
    backfill,
    have_prometheus,
    prom_queries,
    prometheus,
    wait_for_alerts,
)

pytestmark = pytest.mark.skipif(not have_prometheus(), reason="needs prometheus and promtool")

METRIC = naming.metric_name(semconv.METRIC_ACTIVATION_VERDICT, "s", naming.GAUGE)
SLOW_TRACE = "6aee2e60ee10d48857d3024273b70fe4"
SERVERS = [  # instance, outcome, stage, sub-stage, recommendation, change, baseline, value
    ("a", "expanded", "warmup", "warmup.profile", "persist-artifacts",
     "--kv-cache-memory-bytes 1073741824", "thin", 18.8, SLOW_TRACE),
    ("b", "no-baseline", "none", "none", "none", "", "none", 0.0,
     "00000000000000000000000000000001"),
    ("c", "within-noise", "none", "none", "none", "", "measured", 0.0,
     "00000000000000000000000000000002"),
]


def _openmetrics(now: float) -> bytes:
    lines = [f"# TYPE {METRIC} gauge", f"# UNIT {METRIC} seconds"]
    for inst, outcome, stage, sub, rec, change, base, value, trace in SERVERS:
        labels = (f'job="vllm",instance="{inst}",gen_ai_request_model="tiny",'
                  f'ttft_stage="{stage}",ttft_verdict_substage="{sub}",'
                  f'ttft_verdict_recommendation="{rec}",ttft_verdict_change="{change}",'
                  f'ttft_verdict_outcome="{outcome}",ttft_verdict_baseline="{base}",'
                  f'ttft_verdict_phase="ready",ttft_activation_trace_id="{trace}"')
        for k in range(40, 0, -1):  # every 15 s for the last 10 minutes
            lines.append(f"{METRIC}{{{labels}}} {value} {now - 15 * k:.3f}")
    return ("\n".join(lines) + "\n# EOF\n").encode()


def test_the_panel_and_the_alert_read_the_verdict(tmp_path):
    now = time.time()
    data = tmp_path / "data"
    data.mkdir()
    backfill(_openmetrics(now), data, tmp_path, "verdicts")
    (panel_expr,) = [expr for _dash, _id, title, expr in prom_queries()
                     if title == "Why the last switch was slow"]
    with prometheus(tmp_path, data_dir=data) as url:
        out = api(url, "/api/v1/query", query=panel_expr, time=now - 20)
        assert out["status"] == "success", out
        rows = {r["metric"]["instance"]: r for r in out["data"]["result"]}
        assert set(rows) == {"a", "b", "c"}
        slow = rows["a"]["metric"]
        assert (slow["ttft_verdict_substage"], slow["ttft_verdict_change"],
                slow["ttft_activation_trace_id"]) == (
            "warmup.profile", "--kv-cache-memory-bytes 1073741824", SLOW_TRACE)
        assert float(rows["a"]["value"][1]) == pytest.approx(18.8)
        assert rows["b"]["metric"]["ttft_verdict_outcome"] == "no-baseline"

        def slower(alerts):
            return [a for a in alerts
                    if a["labels"]["alertname"] == "OtelTtftActivationSlowerThanUsual"]
        firing = slower(wait_for_alerts(url, lambda alerts: bool(slower(alerts))))
        assert [a["labels"]["instance"] for a in firing] == ["a"]
        annotations = firing[0]["annotations"]
        assert annotations["fix"] == "persist-artifacts: --kv-cache-memory-bytes 1073741824"
        assert "earliest stage that grew: warmup.profile +18.8s" in annotations["summary"]
        assert SLOW_TRACE in annotations["description"]
