"""vLLM's own ``--otlp-traces-endpoint`` beside our provider: said once, in the server's log.

Under ``opentelemetry-instrument`` our configurator has installed the global tracer provider
before vLLM asks for its own. vLLM then cannot install it ("Overriding of current
TracerProvider is not allowed"): its start-up spans go through ours, to the ``OTEL_EXPORTER_OTLP_*``
endpoint, and nothing of this process reaches the URL it was given. It has, though, written that URL
into ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` first, which the EngineCore and worker processes it
starts inherit: their spans go there, and each start's trace is split over two backends. We do
not reroute anything (where spans go stays the user's ``OTEL_*`` settings); we say so, once, in
the API server, with the fix. With vLLM's flag alone (our plugin, no ``opentelemetry-instrument``)
vLLM's provider is the one in force and nothing is said.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.semconv import PROCESS_API_SERVER as API_SERVER

logger = logging.getLogger("otel_ttft")

MESSAGE = (
    "vLLM's --otlp-traces-endpoint %s is ignored for this process while otel-ttft's tracer "
    "provider runs (opentelemetry-instrument): vLLM's spans go to the OTEL_EXPORTER_OTLP_* "
    "endpoint with ours, while the EngineCore and worker processes inherit "
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=%s from vLLM and send theirs there, so each start's "
    "trace is split over two backends. Drop --otlp-traces-endpoint and set "
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=%s (or OTEL_EXPORTER_OTLP_ENDPOINT) instead; see "
    "otel-ttft's docs, server.md")


def provider_in_force() -> bool:
    """Whether some tracer provider was installed globally (ours, or a distro's)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _wrap_init_tracer(call, instance, args, kwargs):
    ours_first = provider_in_force()
    tracer = call(*args, **kwargs)
    if ours_first:
        endpoint = args[1] if len(args) > 1 else kwargs.get("otlp_traces_endpoint")
        logger.warning(MESSAGE, endpoint, endpoint, endpoint)
    return tracer


HOOKS = [
    # AsyncLLM and LLMEngine import it by name from vllm.tracing, after it is patched there
    Hook("vllm_tracing.endpoint_ignored", "vllm.tracing:init_tracer", _wrap_init_tracer,
         process=API_SERVER),
]
