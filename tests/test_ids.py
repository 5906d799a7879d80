"""vLLM seeds Python's ``random`` in every engine; our configurator's id generator keeps span ids
unique where the SDK's default one would repeat them."""

from __future__ import annotations

import random

from opentelemetry.sdk.trace import TracerProvider

from otel_ttft.runtime.configurator import PrivateIdGenerator


def _ids_after_seed(tracer) -> tuple[str, str]:
    random.seed(0)  # what vLLM's set_random_seed does in each engine
    with tracer.start_as_current_span("x") as span:
        ctx = span.get_span_context()
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def test_seeded_random_repeats_the_sdks_default_ids_but_not_ours() -> None:
    default = TracerProvider().get_tracer("t")
    assert _ids_after_seed(default) == _ids_after_seed(default)  # the SDK's default collides
    ours = TracerProvider(id_generator=PrivateIdGenerator()).get_tracer("t")
    assert len({_ids_after_seed(ours) for _ in range(50)}) == 50
