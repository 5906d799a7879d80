"""The embedded store's metric points as Prometheus metric families, built on ``prometheus_client``.

Two uses: a scrape endpoint (``otel-ttft prometheus --dir DIR``) that shows the latest value of each
series as the Collector's ``prometheus`` exporter would (so a home-server Prometheus needs no
Collector), and an OpenMetrics file of every point with its timestamp, for
``promtool tsdb create-blocks-from openmetrics`` (backfill a recorded run).

Points are read only through ``SpanStore.metric_points()``. Cumulative points replace each other;
delta points are added up, as the exporter does. A series not updated for ``expire_s`` is dropped
(the exporter's ``metric_expiration``; our Collector config uses 30 min).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    Exemplar,
    Metric,
)
from prometheus_client.registry import Collector

from otel_ttft.tools.prom import naming

DEFAULT_EXPIRE_S = 30 * 60


@dataclass
class _Series:
    name: str  # Prometheus base name
    mtype: str
    help: str
    labels: dict[str, str]
    points: list[dict] = field(default_factory=list)


def _key(point: dict) -> tuple:
    return (point.get("name"), point.get("type"), _frozen(point.get("attributes")),
            _frozen(point.get("resource")), point.get("scope"))


def _frozen(d: Any) -> tuple:
    return tuple(sorted((str(k), repr(v)) for k, v in (d or {}).items()))


def _accumulate(prev: dict | None, point: dict) -> dict:
    """Delta points add up into one cumulative point; cumulative points replace."""
    if prev is None or point.get("temporality") != "DELTA":
        return point
    out = dict(point)
    if "value" in point:  # float(): the store keeps a non-finite value as "NaN"/"Infinity"
        out["value"] = float(prev.get("value") or 0) + float(point.get("value") or 0)
    if point.get("type") == "histogram" and prev.get("explicit_bounds") == point.get(
            "explicit_bounds"):
        out["count"] = prev.get("count", 0) + point.get("count", 0)
        out["sum"] = float(prev.get("sum") or 0) + float(point.get("sum") or 0)
        out["bucket_counts"] = [a + b for a, b in zip(prev["bucket_counts"],
                                                      point["bucket_counts"], strict=False)]
    return out


def series(points: Iterable[dict], *, history: bool = False) -> list[_Series]:
    """Group points into Prometheus series. ``history``: keep every point (time order), else
    the latest (accumulated) one."""
    by_key: dict[tuple, _Series] = {}
    for point in sorted(points, key=lambda p: p.get("time_ns") or 0):
        if point.get("type") == "exponential_histogram":
            continue  # the exporter converts these to native histograms; we emit none
        try:
            mtype = naming.metric_type(point)
            name = naming.metric_name(str(point.get("name", "")), str(point.get("unit") or ""),
                                      mtype)
        except ValueError:
            continue
        key = _key(point)
        entry = by_key.get(key)
        if entry is None:
            entry = by_key[key] = _Series(
                name, mtype, str(point.get("description") or ""),
                naming.labels(point.get("attributes") or {}, point.get("resource") or {},
                              str(point.get("scope") or "")))
        prev = entry.points[-1] if entry.points else None
        merged = _accumulate(prev, point)
        if history or not entry.points:
            entry.points.append(merged)
        else:
            entry.points[-1] = merged
    return list(by_key.values())


def _bound(value: float) -> str:
    """``le`` as the Collector writes it (Go's FormatFloat 'f', -1): ``1``, ``0.005``, ``+Inf``;
    Prometheus 2.x keeps ``le`` verbatim, so ``1.0`` would be another series."""
    if value == float("inf"):
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _exemplar_by_bucket(point: dict, bounds: list[float]) -> dict[int, Exemplar]:
    out: dict[int, Exemplar] = {}
    for ex in point.get("exemplars") or []:
        value = ex.get("value")
        if value is None or not ex.get("trace_id"):
            continue
        value = float(value)  # the store keeps a non-finite value as "NaN"/"Infinity"
        index = next((i for i, b in enumerate(bounds) if value <= b), len(bounds))
        lbls = {"trace_id": ex["trace_id"]}
        if ex.get("span_id"):
            lbls["span_id"] = ex["span_id"]
        out[index] = Exemplar(lbls, float(value))
    return out


def _ts(point: dict, with_timestamps: bool) -> float | None:
    return point["time_ns"] / 1e9 if with_timestamps and point.get("time_ns") else None


def families(all_series: Iterable[_Series], *, with_timestamps: bool = False,
             shift_s: float = 0.0) -> Iterator[Metric]:
    """One metric family per Prometheus name; label names may differ between its series, so
    samples are added one by one."""
    grouped: dict[tuple[str, str], list[_Series]] = {}
    for s in all_series:
        grouped.setdefault((s.name, s.mtype), []).append(s)
    for (name, mtype), members in sorted(grouped.items()):
        doc = next((m.help for m in members if m.help), "")
        fam = Metric(name.removesuffix("_total") if mtype == naming.COUNTER else name, doc,
                     mtype)
        for s in members:
            for point in s.points:
                ts = _ts(point, with_timestamps)
                _add(fam, name, mtype, s.labels, point, None if ts is None else ts + shift_s)
        yield fam


def _add(fam: Metric, name: str, mtype: str, labels: dict[str, str], point: dict,
         ts: float | None) -> None:
    if mtype == naming.HISTOGRAM:
        bounds = [float(b) for b in point.get("explicit_bounds") or []]
        counts = list(point.get("bucket_counts") or [])
        exemplars = _exemplar_by_bucket(point, bounds)
        cumulative = 0
        for i, bound in enumerate(bounds):
            cumulative += counts[i] if i < len(counts) else 0
            fam.add_sample(f"{name}_bucket", {**labels, "le": _bound(bound)}, cumulative, ts,
                           exemplars.get(i))
        count = point.get("count", 0)
        fam.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, count, ts,
                       exemplars.get(len(bounds)))
        if point.get("sum") is not None:  # an unset sum is left out, as the exporter does
            fam.add_sample(f"{name}_sum", labels, float(point["sum"]), ts)
        fam.add_sample(f"{name}_count", labels, count, ts)
    elif mtype == naming.SUMMARY:
        fam.add_sample(f"{name}_sum", labels, float(point.get("sum") or 0.0), ts)
        fam.add_sample(f"{name}_count", labels, point.get("count", 0), ts)
        for q in point.get("quantiles") or []:
            fam.add_sample(name, {**labels, "quantile": repr(float(q["quantile"]))},
                           float(q["value"]), ts)
    elif point.get("value") is not None:
        fam.add_sample(name, labels, float(point["value"]), ts)


_IDENTIFYING = ("service.name", "service.namespace", "service.instance.id")


def target_info(points: Iterable[dict], *, with_timestamps: bool = False,
                shift_s: float = 0.0) -> Metric | None:
    """``target_info``: one sample per resource, its non-identifying attributes as labels plus
    ``job``/``instance`` (the exporter's default, also with resource_to_telemetry_conversion)."""
    fam = Metric("target", "Target metadata", "info")
    seen: dict[tuple, tuple[dict, float | None]] = {}
    for point in sorted(points, key=lambda p: p.get("time_ns") or 0):
        resource = point.get("resource") or {}
        extra = {k: v for k, v in resource.items() if k not in _IDENTIFYING}
        lbls = naming.labels({}, resource, "", resource_to_telemetry=False)
        for key in ("otel_scope_name", "otel_scope_version", "otel_scope_schema_url"):
            lbls.pop(key)
        for key in sorted(extra):
            lbls[naming.label_name(key)] = naming.label_value(extra[key])
        ts = _ts(point, with_timestamps)
        ts = None if ts is None else ts + shift_s
        # History: one sample per export of each resource; live: the resource once.
        seen[(_frozen(lbls), ts)] = (lbls, ts)
    if not seen:
        return None
    for lbls, ts in sorted(seen.values(), key=lambda v: (_frozen(v[0]), v[1] or 0)):
        fam.add_sample("target_info", lbls, 1.0, ts)
    return fam


class StoreCollector(Collector):
    """A ``prometheus_client`` collector over a ``SpanStore``: read at every scrape."""

    def __init__(self, store: Any, expire_s: float | None = DEFAULT_EXPIRE_S) -> None:
        self.store = store
        self.expire_s = expire_s

    def collect(self) -> Iterator[Metric]:
        now_ns = time.time_ns()
        points = [p for p in self.store.metric_points()
                  if self.expire_s is None or now_ns - (p.get("time_ns") or 0)
                  <= self.expire_s * 1e9]
        info = target_info(points)
        if info is not None:
            yield info
        yield from families(series(points))


def openmetrics_history(points: Iterable[dict], shift_s: float = 0.0) -> bytes:
    """Every point with its own timestamp (+ ``shift_s``), as OpenMetrics text for
    ``promtool tsdb create-blocks-from openmetrics``."""
    points = list(points)
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    class _Once(Collector):
        def collect(self) -> Iterator[Metric]:
            info = target_info(points, with_timestamps=True, shift_s=shift_s)
            if info is not None:
                yield info
            yield from families(series(points, history=True), with_timestamps=True,
                                shift_s=shift_s)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry)
