"""Span plumbing shared by the start-up hooks: stage tagging, and "enrich vLLM's span if it is
open, else open ours" so that one stage is one span. Never sets a provider."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, ranks

if TYPE_CHECKING:
    from otel_ttft.runtime.state import ProcessIdentity

logger = logging.getLogger("otel_ttft")

def flush_async(cfg: config.Config | None) -> None:
    """Export what this process has so far without blocking vLLM: a child can be killed at
    shutdown before its batch processor's next tick, and its start-up spans would be lost.
    ``cfg``'s provider is flushed (None: the global one, for code run where no part is at hand:
    a worker's end of an RPC)."""
    flush = getattr(config.tracer_provider(cfg) if cfg is not None
                    else trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        import threading

        threading.Thread(target=flush, name="otel-ttft-flush", daemon=True).start()


_stage_listeners: list[Callable[[Span], None]] = []
"""Told when a span gets its stage after it started (``tag_span`` on an open span: a shard read,
vLLM's span enriched): the in-flight tracker republishes the open chain with the stage. Added by
the ``inflight`` part when it is made, removed when it closes. (Once every span opens with its
stage, ``start_span(attributes=...)``, the tracker sees it in ``on_start`` and this can go.)"""


def listen_for_stages(listener: Callable[[Span], None]) -> None:
    if listener not in _stage_listeners:
        _stage_listeners.append(listener)


def stop_listening_for_stages(listener: Callable[[Span], None]) -> None:
    if listener in _stage_listeners:
        _stage_listeners.remove(listener)


def tag_span(span: Span, stage: str | None, attributes: Mapping[str, Any] | None,
             identity: ProcessIdentity) -> None:
    """Our attributes on ``span``: its stage, which process this is (``identity``), the rest."""
    if stage is not None:
        span.set_attribute(semconv.ATTR_STAGE, stage)
    if identity.kind:
        span.set_attribute(semconv.ATTR_PROCESS_KIND, identity.kind)
    worker_ranks = ranks.span_attributes()  # which worker of its engine ({} elsewhere)
    if worker_ranks:
        span.set_attributes(worker_ranks)
    if attributes:
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    if stage is not None and _stage_listeners and span.is_recording():
        for listener in list(_stage_listeners):  # a span the sampler dropped is nobody's
            listener(span)


@contextmanager
def stage_span(name: str, stage: str | None, *, enrich: str | None = None,
               attributes: Mapping[str, Any] | None = None,
               context: otel_context.Context | None = None,
               tracer: trace.Tracer, identity: ProcessIdentity) -> Iterator[Span]:
    """The span that measures this stage: vLLM's span ``enrich`` if it is open around us (our
    attributes added), else ours, on the one clock, as the current span."""
    current = trace.get_current_span()
    if enrich is not None and current.is_recording() and getattr(current, "name", None) == enrich:
        tag_span(current, stage, attributes, identity)
        yield current
        return
    # The stage goes in at start: span processors (the in-flight tracker) see it on_start.
    span = tracer.start_span(name, context=context, start_time=clock.now_ns(),
                              attributes={semconv.ATTR_STAGE: stage} if stage else None)
    tag_span(span, stage, attributes, identity)
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        otel_context.detach(token)
        span.end(end_time=clock.now_ns())


def emit_span(name: str, start_ns: int, end_ns: int, *, stage: str | None = None,
              context: otel_context.Context | None = None,
              attributes: Mapping[str, Any] | None = None,
              kind: SpanKind = SpanKind.INTERNAL,
              tracer: trace.Tracer, identity: ProcessIdentity) -> Span:
    """A finished span from timestamps already taken (one clock, epoch ns)."""
    span = tracer.start_span(name, context=context, start_time=start_ns, kind=kind)
    tag_span(span, stage, attributes, identity)
    span.end(end_time=max(end_ns, start_ns))
    return span
