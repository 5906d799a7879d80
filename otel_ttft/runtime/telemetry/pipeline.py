"""What we attach to the tracer provider in force (the one given to ``instrument()``, else the
global one), once per provider: the stage tagger (builds on vLLM's own start-up spans and feeds
the stage metrics), the in-flight tracker, and bounded export. Attached lazily, at the first span
of ours: vLLM may install its provider after the plugin loaded."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Span

from otel_ttft import semconv
from otel_ttft.runtime import clock, config
from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.telemetry import bounded_export, inflight, metrics, sdk_internals


class StageTagger(sdk_internals.EndingHook, inflight.LocalProcessor):
    """Tags vLLM's own start-up spans with ``ttft.stage`` as they open, puts their times on our
    clock, and feeds stage metrics.

    One dict lookup per span start; it is how we build on vLLM's spans instead of duplicating them.
    vLLM stamps them with the wall clock (the SDK's default, ``time.time()``), ours with the
    monotonic one: after a wall-clock step the two differ by seconds, so each time is moved as
    it is taken (``clock.from_wall_ns``), and our spans nest in theirs whatever the wall clock did.
    """

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        stage = semconv.VLLM_SPAN_STAGES.get(span.name)
        if stage is not None and span.is_recording():
            if _made_by_vllm(span):
                sdk_internals.restamp_start(span, clock.from_wall_ns(span.start_time))
            span.set_attribute(semconv.ATTR_STAGE, stage)
            if this_process.kind:
                span.set_attribute(semconv.ATTR_PROCESS_KIND, this_process.kind)

    def ending(self, span: Span) -> None:
        if span.name in semconv.VLLM_SPAN_STAGES and span.end_time is not None \
                and _made_by_vllm(span):
            sdk_internals.restamp_end(span, clock.from_wall_ns(span.end_time))

    def ignores_start(self, name: str) -> bool:
        return name not in semconv.VLLM_SPAN_STAGES

    def ignores_end(self, name: str) -> bool:
        """The request span carries its stages as seconds, never a ``ttft.stage``."""
        return name == semconv.SPAN_REQUEST

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        stage = attrs.get(semconv.ATTR_STAGE)
        if stage is None or span.end_time is None or span.start_time is None:
            return
        if semconv.stage_family(str(stage)) in (semconv.STAGE_LOAD, semconv.STAGE_WARMUP,
                                                semconv.STAGE_SWITCH):
            metrics.record_activation_stage(str(stage), (span.end_time - span.start_time) / 1e9,
                                            this_process.served_model, span.context.trace_id,
                                            attrs.get(semconv.ATTR_COMPILE_CACHE_HIT))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _made_by_vllm(span: Any) -> bool:
    """A span of vLLM's tracers (scope ``vllm.*``, its times on the wall clock); where vLLM has
    none we open spans of the same names, on our clock."""
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", "") or ""
    return name == "vllm" or name.startswith("vllm.")


_attached: set[int] = set()


def attach() -> None:
    """Attach the StageTagger, the in-flight tracker and bounded export to the SDK tracer provider
    in force, once per provider (a proxy or API-only provider is left alone); bounded export
    takes the meter provider in force too."""
    provider = config.tracer_provider()
    if id(provider) in _attached or not hasattr(provider, "add_span_processor"):
        return
    _attached.add(id(provider))
    provider.add_span_processor(StageTagger())
    inflight.install(provider)
    bounded_export.harden(provider, config.meter_provider())
