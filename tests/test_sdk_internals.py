"""The SDK internals we reach into are all there on the installed SDK, and a moved one is named
(``sdk_internals.check``); where one is missing, its caller keeps the SDK's own behaviour."""

from __future__ import annotations

import ast
import atexit
from pathlib import Path
from typing import Any

import pytest

from otel_ttft.runtime.telemetry import bounded_export, sdk_internals


class Without:
    """An SDK object whose named attributes moved away (a later SDK, say); the rest is its own."""

    def __init__(self, inner: Any, *missing: str) -> None:
        self._inner, self._missing = inner, missing

    def __getattr__(self, name: str) -> Any:
        if name in self._missing:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_the_installed_sdk_has_every_internal_we_use():
    assert sdk_internals.check() == []


def _newly_missing(change) -> list[str]:
    """What ``check`` names on a probe changed by ``change(probe)``, beyond an untouched one."""
    probe, close = sdk_internals._probe()
    try:
        before = sdk_internals.check(probe)
        change(probe)
        return [name for name in sdk_internals.check(probe) if name not in before]
    finally:
        close()


@pytest.mark.parametrize(("part", "missing", "named"), [
    ("tracer_provider", ("_active_span_processor",),
     "TracerProvider._active_span_processor._span_processors"),
    ("batch_span_processor", ("_batch_processor",), "BatchSpanProcessor._batch_processor"),
    ("meter_provider", ("_metric_readers", "_sdk_config"),
     "MeterProvider._metric_readers (or _sdk_config.metric_readers)"),
    ("periodic_reader", ("_exporter",), "PeriodicExportingMetricReader._exporter"),
    ("span", ("_lock",), "Span._lock"),
    ("histogram", ("_measurement_consumer",),
     "Histogram._measurement_consumer._reader_storages -> explicit-bucket aggregation "
     "(its _reservoir; _sdk_config.exemplar_filter)"),
])
def test_an_internal_that_moved_is_named(part, missing, named):
    found = _newly_missing(lambda p: setattr(p, part, Without(getattr(p, part), *missing)))
    assert named in found
    # Only what depends on that object is reported: the other checks still pass on the probe.
    assert len(found) <= 4, found


def test_a_moved_queue_metrics_object_is_named():
    def change(probe):
        batch = sdk_internals.batch_processor(probe.batch_span_processor)
        batch._metrics = Without(batch._metrics, "drop_items")  # processor metrics changed

    assert _newly_missing(change) == ["BatchProcessor._metrics.drop_items"]


def test_a_provider_without_the_internals_keeps_the_sdks_own_exit():
    """Bounded export leaves a provider it cannot read alone: its own atexit shutdown stays."""
    probe, close = sdk_internals._probe()
    try:
        provider = Without(probe.tracer_provider, "_active_span_processor")
        before = bounded_export.dropped()
        bounded_export.harden(provider, meter_provider=object())
        assert provider not in bounded_export._providers
        assert probe.tracer_provider._atexit_handler == probe.tracer_provider.shutdown
        assert bounded_export.dropped() == before
    finally:
        close()
    atexit.unregister(probe.tracer_provider.shutdown)  # shut down already; never again at exit


# The SDK's private names this package uses; each may appear in sdk_internals only.
_PRIVATE = {"_active_span_processor", "_span_processors", "_batch_processor", "_sdk_config",
            "_metric_readers", "_measurement_consumer", "_reader_storages",
            "_get_or_init_view_instrument_match", "_attributes_aggregation", "_reset_on_collect",
            "_ExplicitBucketHistogramAggregation", "_hash_attributes", "_OTelSDKConfigurator",
            "RandomIdGenerator", "_tracer_metrics", "_span_limits", "_instrumentation_scope",
            "_is_enabled", "_on_ending", "_start_time", "_end_time"}
# Read by name (getattr) on SDK objects: common words, so only as strings.
_PRIVATE_BY_NAME = _PRIVATE | {"_exporter", "_metrics", "_queue", "_shutdown", "_endpoint",
                               "_lock", "_tracer", "_span_processor"}


def _sdk_accesses(tree: ast.AST) -> list[str]:
    """Code (not docstrings or log-name strings) that names an SDK internal or imports from a
    private SDK module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in _PRIVATE:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Constant) and node.value in _PRIVATE_BY_NAME:
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                       else [a.name for a in node.names])
            names = {a.name for a in node.names}
            if any(m.startswith("opentelemetry.sdk") and "._" in m for m in modules) or \
                    names & _PRIVATE:
                found.append(f"line {node.lineno}: import {', '.join(modules)}")
    return found


def test_no_other_module_reaches_into_the_sdk():
    own = Path(sdk_internals.__file__)
    package = own.parents[2]
    found = {str(path.relative_to(package.parent)): hits for path in sorted(package.rglob("*.py"))
             if path != own and (hits := _sdk_accesses(ast.parse(path.read_text())))}
    assert found == {}
    assert _sdk_accesses(ast.parse(own.read_text()))  # the rule finds what is there
