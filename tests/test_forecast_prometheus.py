"""The forecast panel in a real Prometheus (Debian's 2.42): backfilled
``ttft_switch_forecast_seconds`` series of one server (forecasting the model it would make way for)
and the last activation's stages give the two panels of the activations dashboard their rows,
stage by stage, side by side."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.prom import naming
from tests.prom_helpers import api, backfill, have_prometheus, prom_queries, prometheus

pytestmark = pytest.mark.skipif(not have_prometheus(), reason="needs prometheus and promtool")

ROOT = Path(__file__).resolve().parents[1]
FORECAST = naming.metric_name(semconv.METRIC_SWITCH_FORECAST, "s", naming.GAUGE)
LAST = "ttft_activation_stage_last_duration_seconds"
# stage, bound, value: what a server of model A reports for model B
POINTS = [("switch", "expected", 3.5), ("load", "expected", 2.3), ("warmup", "expected", 22.0),
          ("prefill", "expected", 0.05), ("total", "expected", 27.85), ("total", "low", 25.0),
          ("total", "high", 31.0)]


CHEAPEST = re.search(r"(bottomk.*?\})\)", (ROOT / "docs" / "forecast.md").read_text(),
                     re.S).group(0)


def _openmetrics(now: float) -> bytes:
    lines = [f"# TYPE {FORECAST} gauge", f"# UNIT {FORECAST} seconds"]
    for stage, bound, value in POINTS:
        labels = (f'job="vllm",instance="a",gen_ai_request_model="B",ttft_stage="{stage}",'
                  f'ttft_forecast_bound="{bound}",ttft_forecast_driver="restart",'
                  f'ttft_forecast_basis_count="2"')
        lines += [f"{FORECAST}{{{labels}}} {value} {now - 15 * k:.3f}" for k in range(40, 0, -1)]
    lines += [f"# TYPE {LAST} gauge", f"# UNIT {LAST} seconds"]
    for stage, value in (("load.read", 2.1), ("warmup.process_start", 21.0)):
        labels = f'job="vllm",instance="b",gen_ai_request_model="B",ttft_stage="{stage}"'
        lines += [f"{LAST}{{{labels}}} {value} {now - 15 * k:.3f}" for k in range(40, 0, -1)]
    return ("\n".join(lines) + "\n# EOF\n").encode()


def test_the_forecast_panel_sits_beside_the_last_switchs_actual_stages(tmp_path):
    now = time.time()
    data = tmp_path / "data"
    data.mkdir()
    backfill(_openmetrics(now), data, tmp_path, "forecast")
    queries = {title: expr for _dash, _id, title, expr in prom_queries()}
    forecast = queries["Forecast: each model's next first token, per stage"]
    actual = queries["The last switch's actual stages, per model"]
    with prometheus(tmp_path, data_dir=data) as url:
        out = api(url, "/api/v1/query", query=forecast, time=now - 20)
        assert out["status"] == "success", out
        rows = {r["metric"]["ttft_stage"]: float(r["value"][1]) for r in out["data"]["result"]}
        assert rows == {"switch": 3.5, "load": 2.3, "warmup": 22.0, "prefill": 0.05,
                        "total": 27.85}  # the expected values only: one row per stage
        assert {r["metric"]["gen_ai_request_model"] for r in out["data"]["result"]} == {"B"}
        out = api(url, "/api/v1/query", query=actual, time=now - 20)
        rows = {r["metric"]["ttft_stage"]: float(r["value"][1]) for r in out["data"]["result"]}
        assert rows == {"load.read": 2.1, "warmup.process_start": 21.0}
        # docs/forecast.md's query for a swapper: the model cheapest to bring back
        (cheapest,) = api(url, "/api/v1/query", query=CHEAPEST, time=now - 20)["data"]["result"]
        assert cheapest["metric"]["gen_ai_request_model"] == "B"
        assert float(cheapest["value"][1]) == pytest.approx(27.85)
