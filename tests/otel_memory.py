"""One in-memory provider for the whole pytest process (a global provider can be set once), built
by our configurator as ``opentelemetry-instrument`` builds it in a vLLM process: our processors
first, a counting exporter, a bounded exit; spans exported as they end."""

from __future__ import annotations

from functools import cache

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft.runtime import configurator


@cache
def memory_exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    configurator.configure({}, span_exporters=[exporter], metric_readers=[],
                           span_processor=SimpleSpanProcessor)
    return exporter
