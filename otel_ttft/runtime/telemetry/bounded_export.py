"""Telemetry never slows vLLM down, whatever the collector does.

The SDK's exit path flushes with the exporter's timeout and retries (10 s and more per process with
the collector down: 13 s added to every restart-style model switch). Here, per provider, once:

- each batch exporter is wrapped so that what it could not send is counted
  (``ttft.telemetry.dropped`` by signal and reason) and logged once per process, and queue
  overflow (the SDK's bounded queue drops the oldest) is counted too;
- the SDK's and vLLM's ``atexit`` shutdowns are replaced by one with a deadline of its own
  (``OTEL_TTFT_EXIT_TIMEOUT_MS``, 500 ms, read into ``config``): trace and metric providers flush
  in parallel, and whatever has not gone by then is counted, logged once, and abandoned: never
  retried.

The SDK's queues stay as they are: bounded (``OTEL_BSP_MAX_QUEUE_SIZE``), non-blocking for the
code that ends a span, so requests are never delayed and memory stays flat while the collector is
down or slow. What this reaches inside the SDK is in ``sdk_internals``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime.telemetry import metrics, offload, sdk_internals

logger = logging.getLogger("otel_ttft")

_lock = threading.Lock()
_hardened: set[int] = set()
_wrapped: list[CountingExporter] = []
_queues: list[Any] = []  # the SDK batch processors whose queues we watch
_dropped: dict[tuple[str, str], int] = {}
_warned = False
_exit_registered = False
_deadline: float | None = None  # monotonic: past it, exporters give up at once
_exited = False


# --- counting ---
_drop_counters: dict[int, tuple[Any, Any]] = {}  # id(meter provider) -> (it, its counter)


def _drop_counter() -> Any:
    """The drop counter on the meter provider in force (``config.meter_provider``), made once per
    provider."""
    provider = config.meter_provider()
    found = _drop_counters.get(id(provider))
    if found is None or found[0] is not provider:
        counter = metrics.meter(provider=provider).create_counter(
            semconv.METRIC_TELEMETRY_DROPPED, unit="{item}",
            description="Spans and metric points this process could not send (collector down, "
                        "slow, or the exit deadline passed)")
        found = _drop_counters[id(provider)] = (provider, counter)
    return found[1]


def count_dropped(signal: str, reason: str, n: int, detail: str = "") -> None:
    global _warned
    if n <= 0:
        return
    with _lock:
        _dropped[(signal, reason)] = _dropped.get((signal, reason), 0) + n
        first, _warned = not _warned, True
    with contextlib.suppress(Exception):
        _drop_counter().add(n, {semconv.ATTR_TELEMETRY_SIGNAL: signal,
                                semconv.ATTR_TELEMETRY_DROP_REASON: reason})
    if first:
        logger.warning("otel-ttft: telemetry is not reaching the collector (%s: %s%s); it is "
                       "dropped and counted in %s, and this is logged once per process",
                       signal, reason, f", {detail}" if detail else "",
                       semconv.METRIC_TELEMETRY_DROPPED)


def dropped() -> dict[tuple[str, str], int]:
    """(signal, reason) -> count, for this process so far."""
    with _lock:
        return dict(_dropped)


def _points(batch: Any) -> int:
    """Data points in a MetricsData, or items in a span batch."""
    resource_metrics = getattr(batch, "resource_metrics", None)
    if resource_metrics is None:
        return len(batch)
    return sum(len(getattr(m.data, "data_points", ()) or ())
               for rm in resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


class CountingExporter:
    """Wraps an SDK span or metric exporter: counts failed batches; fails fast after the exit
    deadline. Everything else is delegated unchanged."""

    def __init__(self, inner: Any, signal: str) -> None:
        self._inner, self._signal = inner, signal
        self._in_flight = 0  # items of the export running now
        self._abandoned = False  # the exit deadline passed during that export: counted there
        self.counted_ahead = 0  # items still queued at the deadline, counted there already

    def export(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        n = _points(batch)
        if _deadline is not None and time.monotonic() >= _deadline:
            # The queue drains oldest first: its first ``counted_ahead`` items were counted.
            ahead = min(n, self.counted_ahead)
            self.counted_ahead -= ahead
            count_dropped(self._signal, semconv.DROP_EXIT_DEADLINE, n - ahead)
            return _failure(self._inner)
        self._in_flight, self._abandoned = n, False
        try:
            result = self._inner.export(batch, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the SDK would log and drop it too
            result, detail = _failure(self._inner), repr(exc)
        else:
            detail = _endpoint(self._inner)
        finally:
            self._in_flight = 0
        if getattr(result, "name", "") == "FAILURE" and not self._abandoned:
            count_dropped(self._signal, semconv.DROP_EXPORT_FAILED, n, detail)
        return result

    def abandon(self) -> None:
        """At the exit deadline: what is being sent now counts as not delivered."""
        if self._in_flight:
            self._abandoned = True
            count_dropped(self._signal, semconv.DROP_EXIT_DEADLINE, self._in_flight)
        if not sdk_internals.exporter_shut_down(self._inner):  # interrupts retry back-off
            threading.Thread(target=_quietly, args=(self._inner.shutdown,), daemon=True).start()

    def shutdown(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.shutdown(*args, **kwargs)

    def force_flush(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.force_flush(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _failure(inner: Any) -> Any:
    module = type(inner).__module__
    if "metric" in module:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return MetricExportResult.FAILURE
    from opentelemetry.sdk.trace.export import SpanExportResult

    return SpanExportResult.FAILURE


def _endpoint(exporter: Any) -> str:
    endpoint = sdk_internals.exporter_endpoint(exporter)
    return f"endpoint {endpoint}" if endpoint else ""


class _QueueDropCounter:
    """Stands in for a batch processor's own metrics object to count queue overflow."""

    def __init__(self, inner: Any, signal: str) -> None:
        self._inner, self._signal = inner, signal

    def drop_items(self, count: int, *args: Any, **kwargs: Any) -> Any:
        reason = args[0] if args else kwargs.get("reason")
        if reason is None:  # "already_shutdown" is the exit path, counted there
            count_dropped(self._signal, semconv.DROP_QUEUE_FULL, count)
        return self._inner.drop_items(count, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# --- hardening providers ---
def harden(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Wrap the exporters of these SDK providers (default: the ones in force, ``config``) and take
    over their exit; idempotent. Anything not shaped like the SDK's (another SDK, a no-op
    provider) is left alone."""
    tp = tracer_provider if tracer_provider is not None else config.tracer_provider()
    mp = meter_provider if meter_provider is not None else config.meter_provider()
    for provider, fn in ((tp, _harden_tracing), (mp, _harden_metrics)):
        if provider is None or id(provider) in _hardened:
            continue
        try:
            if fn(provider):
                _hardened.add(id(provider))
                _register_exit()
        except Exception:  # noqa: BLE001 - SDK internals moved: keep the SDK's behaviour
            logger.debug("otel-ttft: could not bound %r", provider, exc_info=True)


# The SDK logs every failed attempt of every batch; with the collector down for an hour that is
# thousands of lines. Each distinct message passes once per process; our count says the rest.
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.metrics._internal.export",
)


class _OncePerMessage(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


_log_filter = _OncePerMessage()


def _quiet_sdk_logs() -> None:
    for name in _SDK_LOGGERS:
        log = logging.getLogger(name)
        if _log_filter not in log.filters:
            log.addFilter(_log_filter)


def _harden_tracing(provider: Any) -> bool:
    processors = sdk_internals.span_processors(provider)
    if processors is None or not hasattr(provider, "shutdown"):
        return False
    for proc in processors:
        batch = sdk_internals.batch_processor(proc)
        if batch is None or isinstance(sdk_internals.batch_exporter(batch), CountingExporter):
            continue
        wrapped = sdk_internals.wrap_batch_exporter(
            batch, lambda inner: CountingExporter(offload.maybe_offload(inner), "spans"))
        if wrapped is None:
            continue
        _wrapped.append(wrapped)
        sdk_internals.wrap_queue_metrics(batch, lambda inner: _QueueDropCounter(inner, "spans"))
        _queues.append(batch)
    return _take_exit(provider)


def _harden_metrics(provider: Any) -> bool:
    readers = sdk_internals.metric_readers(provider)
    if readers is None or not hasattr(provider, "shutdown"):
        return False
    for reader in readers:
        if isinstance(sdk_internals.reader_exporter(reader), CountingExporter):
            continue
        wrapped = sdk_internals.wrap_reader_exporter(
            reader, lambda inner: CountingExporter(inner, "metrics"))
        if wrapped is not None:
            _wrapped.append(wrapped)
    return _take_exit(provider)


def _take_exit(provider: Any) -> bool:
    """The provider flushes in ``bounded_exit``, not in its own (and vLLM's) atexit shutdown."""
    sdk_internals.stop_shutdown_at_exit(provider)
    _providers.append(provider)
    return True


_providers: list[Any] = []
_before_flush: list[Any] = []


def before_flush(callback: Any) -> None:
    """Run ``callback()`` at exit before the final flush (the in-flight tracker ends its open
    spans there, so they are exported); registered, not imported, to keep this module a leaf."""
    if callback not in _before_flush:
        _before_flush.append(callback)


def _register_exit() -> None:
    global _exit_registered
    with _lock:
        if _exit_registered:
            return
        _exit_registered = True
    # vLLM's processes end with the root logger at ERROR: our two lines (first drop, exit summary)
    # would vanish. A level set on "otel_ttft" by the user still wins.
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    _quiet_sdk_logs()
    with contextlib.suppress(Exception):
        _drop_counter()  # created now: at exit the meter provider may be shutting down
    atexit.register(bounded_exit)


# --- the exit path ---
def bounded_exit(timeout_s: float | None = None) -> None:
    """End open activation spans, flush every hardened provider in parallel, stop at the deadline;
    what is left is counted and logged, not retried. Runs once."""
    global _deadline, _exited
    with _lock:
        if _exited:
            return
        _exited = True
    budget = config.current.exit_timeout_s if timeout_s is None else timeout_s
    start = time.monotonic()
    for callback in _before_flush:
        with contextlib.suppress(Exception):
            callback()
    threads = []
    for provider in _providers:
        shutdown = provider.shutdown
        with contextlib.suppress(TypeError, ValueError):
            import inspect

            if "timeout_millis" in inspect.signature(shutdown).parameters:
                ms = budget * 1000
                shutdown = (lambda p=provider, ms=ms: p.shutdown(timeout_millis=ms))
        t = threading.Thread(target=_quietly, args=(shutdown,), name="otel-ttft-exit",
                             daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, start + budget - time.monotonic()))
    _deadline = time.monotonic()  # from here on, exporters fail fast
    if any(t.is_alive() for t in threads):
        for batch in _queues:
            left = sdk_internals.queue_length(batch)
            exporter = sdk_internals.batch_exporter(batch)
            if isinstance(exporter, CountingExporter):
                exporter.counted_ahead += left  # the worker may still try them: not twice
            count_dropped("spans", semconv.DROP_EXIT_DEADLINE, left)
        for exporter in _wrapped:  # a send blocked on a silent collector is left behind
            exporter.abandon()
    _log_summary(time.monotonic() - start)


def _quietly(fn: Any) -> None:
    with contextlib.suppress(Exception):
        fn()


def _log_summary(elapsed_s: float) -> None:
    counts = dropped()
    if not counts:
        return
    parts = ", ".join(f"{n} {sig} ({reason})" for (sig, reason), n in sorted(counts.items()))
    logger.warning("otel-ttft: pid %d exits after %.0f ms of final flush; not delivered: %s",
                   os.getpid(), elapsed_s * 1000, parts)
