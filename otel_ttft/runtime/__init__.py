"""The runtime: what every vLLM process imports (API server, EngineCore, workers).

``instrumentor`` and ``plugin`` are the entry points; ``hooks`` measure the stages, one module (or
package) per stage family; ``telemetry`` is the span, metric, export and lifecycle machinery the
hooks use; ``context`` says which process this is. The runtime is small, cheap to import and
imports nothing from ``otel_ttft.tools`` (checked by ``make lint``): it may use only
``otel_ttft.semconv`` and ``otel_ttft.version`` beside itself.
"""
