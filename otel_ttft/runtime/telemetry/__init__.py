"""Span and metric machinery shared by every hook: spans on the one clock (``spans``), OTel
instruments (``metrics``), open activation spans kept across hangs and crashes (``inflight``), an
exporter that never holds vLLM's exit (``bounded_export``), what is attached to the provider
(``pipeline``), and the one module that touches OpenTelemetry SDK internals (``sdk_internals``).

Dependencies point one way, ``pipeline -> inflight -> bounded_export`` and ``-> spans``; the
lower modules learn of the upper ones through callbacks registered here, never by importing back.
"""

from otel_ttft.runtime.telemetry import pipeline, spans

spans.set_provider_setup(pipeline.attach)
