"""vLLM seeds Python's ``random`` in every engine; our instrumentation keeps span ids unique."""

from __future__ import annotations

import random

from opentelemetry.sdk.trace import TracerProvider

from otel_ttft.runtime import ids


def _ids_after_seed(tracer) -> tuple[str, str]:
    random.seed(0)  # what vLLM's set_random_seed does in each engine
    with tracer.start_as_current_span("x") as span:
        ctx = span.get_span_context()
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def test_seeded_random_repeats_ids_unless_installed() -> None:
    tracer = TracerProvider().get_tracer("t")  # made before instrumenting, like vLLM's
    ids.uninstall()
    assert _ids_after_seed(tracer) == _ids_after_seed(tracer)  # the SDK's default collides
    ids.install()
    try:
        seen = {_ids_after_seed(tracer) for _ in range(50)}
        assert len(seen) == 50
    finally:
        ids.uninstall()
    assert _ids_after_seed(tracer) == _ids_after_seed(tracer)  # uninstrument restores
