"""The forecast against what happened: each switching request the replay made carries the
forecast of its model's first token read just before the switch (``ttft.replay.forecast``); the
analysis puts it beside the request's measured stages.

The attribute comes from a file anyone could have written: it is kept only as numbers it can
compare (finite, non-negative seconds), everything else dropped.
"""

from __future__ import annotations

import json
import math
from typing import Any

from otel_ttft import semconv
from otel_ttft.tools.analysis.report_format import fmt_s

PIPELINE = semconv.TTFT_PIPELINE
MAX_S = 1e6
MAX_TEXT = 64 * 1024  # a forecast is a few KiB of JSON


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return round(value, 6) if math.isfinite(value) and 0 <= value <= MAX_S else None


def parse(value: Any) -> dict | None:
    """The forecast attribute as ``{"status", "total_s", "low_s", "high_s", "stages",
    "basis_count", "basis"}`` (stages: family -> expected seconds), or None when absent or not
    one."""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        return None
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None
    stages = doc.get("stages") if isinstance(doc.get("stages"), dict) else {}
    kept = {}
    for stage in PIPELINE:
        one = stages.get(stage)
        seconds = _seconds(one.get("expected_s")) if isinstance(one, dict) else None
        if seconds is not None:
            kept[stage] = seconds
    basis = doc.get("basis") if isinstance(doc.get("basis"), list) else []
    count = doc.get("basis_count")
    return {"status": doc["status"][:40], "total_s": _seconds(doc.get("total_s")),
            "low_s": _seconds(doc.get("low_s")), "high_s": _seconds(doc.get("high_s")),
            "stages": kept,
            "basis_count": count if isinstance(count, int) and not isinstance(count, bool)
            else 0,
            "basis": [str(b)[:300] for b in basis[:12] if isinstance(b, str)]}


def compare(forecast: dict, record: dict) -> dict:
    """The forecast beside the request's measured TTFT and stages: the error of the total (a
    share of the measured), and whether the largest stages agree."""
    out = dict(forecast)
    total, actual = forecast.get("total_s"), record["client_ttft_s"]
    out["actual_s"] = actual
    if total is None:
        return out
    out["error"] = round((total - actual) / actual, 4) if actual > 0 else None
    measured = record["stages"]
    out["largest_forecast"] = max(forecast["stages"], key=forecast["stages"].get, default=None)
    out["largest_actual"] = max(measured, key=measured.get, default=None)
    out["within_range"] = (forecast.get("low_s") is not None and forecast.get("high_s") is not None
                           and forecast["low_s"] <= actual <= forecast["high_s"])
    return out


def rows(doc: dict) -> list[dict]:
    """Every request of the analysis that carries a forecast: scenario, model, repeat, the
    comparison, and each stage forecast against measured."""
    out = []
    for r in doc.get("requests", ()):
        f = r.get("forecast")
        if not isinstance(f, dict):
            continue
        out.append({"scenario": r["scenario"], "model": r["model"],
                    "repeat_index": r.get("repeat_index"), **f,
                    "stages_vs": {s: (f["stages"].get(s), r["stages"].get(s, 0.0))
                                  for s in PIPELINE
                                  if f["stages"].get(s) or r["stages"].get(s, 0.0) >= 0.005}})
    return out


def table(analysis: Any) -> list[dict[str, Any]]:
    """The report's table (an ``Analysis``): each request that carries a forecast, forecast
    beside measured."""
    out = []
    for r in analysis.requests:
        f = r.forecast
        if f is None:
            continue
        known = f.total_s is not None
        out.append({
            "scenario": r.scenario, "repeat": "" if r.repeat_index is None else r.repeat_index,
            "model": _short(r.model or "?", 40),
            "total": fmt_s(f.total_s) if known else f.status,
            "range": f"{fmt_s(f.low_s)} \u2013 {fmt_s(f.high_s)}"
            if known and f.low_s is not None and f.high_s is not None else "\u2013",
            "actual": fmt_s(r.client_ttft_s),
            "error": f"{f.error:+.0%}" if f.error is not None else "\u2013",
            "stages": [f"{fmt_s(f.stages[st]) if st in f.stages else chr(8211)} / "
                       f"{fmt_s(r.stages.get(st, 0.0))}" if known else "\u2013"
                       for st in PIPELINE]})
    return out


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "\u2026"
