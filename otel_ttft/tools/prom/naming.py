"""OTel -> Prometheus names, as the OpenTelemetry Collector's ``prometheus`` exporter writes them.

The rules of the exporter's default translation (``UnderscoreEscapingWithSuffixes``, from
``prometheus/otlptranslator``), reproduced so that rules and dashboards query the names a real
Collector produces: the name is split on every character outside ``[a-zA-Z0-9:]`` and joined with
``_``; the unit becomes a suffix (``s`` -> ``seconds``, ``By`` -> ``bytes``, ``GBy/s`` ->
``gigabytes_per_second``; ``{annotations}`` and ``1`` give none) unless the name already has that
token; monotonic sums end in ``_total``; gauges of unit ``1`` end in ``_ratio``. Attribute keys keep
``[a-zA-Z0-9_]`` (others become ``_``), a leading digit gets ``key_``, a single leading ``_``
becomes ``key_``. ``service.name`` (with ``service.namespace/``) is ``job`` and
``service.instance.id`` is ``instance``.
"""

from __future__ import annotations

import re

GAUGE, COUNTER, HISTOGRAM, SUMMARY, UNTYPED = "gauge", "counter", "histogram", "summary", "untyped"

_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month",
              "y": "year"}
_NAME_SPLIT = re.compile(r"[^a-zA-Z0-9:]+")
_INVALID_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9:]")
_INVALID_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def _clean_unit(unit: str) -> str:
    return re.sub(r"__+", "_", _INVALID_METRIC_CHAR.sub("_", unit)).lstrip("_")


def _unit_suffixes(unit: str) -> tuple[str, str]:
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_suffix = "" if not main or "{" in main or "}" in main else _UNITS.get(main, main)
    per_suffix = ""
    if per and "{" not in per and "}" not in per:
        per_suffix = "per_" + _PER_UNITS.get(per, per)
    return _clean_unit(main_suffix), _clean_unit(per_suffix)


def metric_type(point: dict) -> str:
    """The Prometheus type of a stored OTLP point (non-monotonic sums are gauges)."""
    kind = point.get("type")
    if kind == "sum":
        return COUNTER if point.get("is_monotonic") else GAUGE
    if kind == "histogram":
        return HISTOGRAM
    if kind == "summary":
        return SUMMARY
    return GAUGE if kind == "gauge" else UNTYPED


def metric_name(name: str, unit: str, mtype: str) -> str:
    """``ttft.activation.stage.duration`` (s, histogram) ->
    ``ttft_activation_stage_duration_seconds`` (then ``_bucket``/``_sum``/``_count``); counters
    end in ``_total``."""
    tokens = [t for t in _NAME_SPLIT.split(name) if t]
    main, per = _unit_suffixes(unit or "")
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [t for t in (main, per) if t]
    if mtype == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and mtype == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    if out and out[0].isdigit():
        out = "_" + out
    if not out.strip("_"):
        raise ValueError(f"metric name {name!r} has no Prometheus form")
    return out


def label_name(key: str) -> str:
    """``gen_ai.request.model`` -> ``gen_ai_request_model``."""
    if not key:
        return key
    out = _INVALID_LABEL_CHAR.sub("_", key)
    if out[0].isdigit():
        out = "key_" + out
    elif out.startswith("_") and not out.startswith("__"):
        out = "key" + out
    return out


def label_value(value: object) -> str:
    """Attribute values as the Collector's ``AsString``: booleans ``true``/``false``, lists JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        import json

        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):  # Go's FormatFloat(v, 'f', -1, 64)
        return str(int(value)) if value.is_integer() else repr(value)
    return "" if value is None else str(value)


def labels(attributes: dict, resource: dict, scope: str, scope_version: str = "",
           *, resource_to_telemetry: bool = True) -> dict[str, str]:
    """Point attributes (+ resource attributes when ``resource_to_telemetry_conversion`` is on,
    as in our Collector config), scope labels, then ``job``/``instance``. Keys that collide after
    sanitizing are joined with ``;`` in key order, as the exporter does."""
    merged = dict(resource) if resource_to_telemetry else {}
    merged.update(attributes)
    out: dict[str, str] = {}
    for key in sorted(merged):
        name, value = label_name(key), label_value(merged[key])
        out[name] = f"{out[name]};{value}" if out.get(name) else value
    out["otel_scope_name"] = scope or ""
    out["otel_scope_version"] = scope_version or ""
    out["otel_scope_schema_url"] = ""
    service = resource.get("service.name")
    if service is not None:
        namespace = resource.get("service.namespace")
        out["job"] = f"{namespace}/{service}" if namespace else str(service)
    if resource.get("service.instance.id") is not None:
        out["instance"] = str(resource["service.instance.id"])
    return out
