"""The ``vllm.general_plugins`` entry point.

vLLM loads it in the API server, in EngineCore and in every worker, even when nothing runs under
``opentelemetry-instrument`` (vLLM's own ``--otlp-traces-endpoint`` then supplies the provider).
It may be called several times per process; instrumenting is idempotent. A helper process
(``runtime.gate``: e.g. vLLM's model-inspection subprocess, should it load plugins) gets nothing.
"""

from __future__ import annotations

import logging

from otel_ttft.runtime import gate

logger = logging.getLogger("otel_ttft")


def register() -> None:
    if gate.classify() == gate.HELPER:
        return
    try:
        from otel_ttft.runtime.hooks import activation
        from otel_ttft.runtime.instrumentor import instrument_once

        instrumentor = instrument_once()
        state = instrumentor.state
        activation.on_plugin_loaded(state.part(activation.PART) if state else None)
    except Exception:  # never stop vLLM from starting
        logger.warning("otel-ttft plugin failed to load; vLLM runs uninstrumented", exc_info=True)
