"""Every use of OpenTelemetry SDK internals, in one module: what an SDK upgrade can break.

Each function below reads or writes one private part of the SDK (``opentelemetry-sdk``, the range
in ``pyproject.toml``), says why the public API does not serve, and returns ``None`` / ``False``
where the part is not there, so the caller keeps the SDK's own behaviour (never an error). Nothing
else in the package touches a private attribute of the SDK (``tests/test_sdk_internals.py``).

One module on purpose, however long: an SDK upgrade is reviewed by reading this file alone.

``check()`` builds throwaway SDK objects and lists every internal below that they lack: empty on
a supported SDK (``tests/test_sdk_internals.py``; ``otel-ttft doctor`` prints it).
"""

from __future__ import annotations

import atexit
import contextlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

try:  # the SDK's default histogram aggregation and its attribute key
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.aggregation import (
        _ExplicitBucketHistogramAggregation as _ExplicitBuckets,
    )
except ImportError:  # pragma: no cover - another SDK version: ``Histogram.record`` only
    _hash_attributes = _ExplicitBuckets = None  # type: ignore[assignment,misc]


# --- context: the current context without its accessor's frames ---------------------------------

def current_context_getter() -> Callable[[], Any]:
    """``opentelemetry.context.get_current`` as one C call: the ``get`` of the default runtime
    context's ``ContextVar`` (``_RUNTIME_CONTEXT._current_context``), which is all it does, in
    two Python frames that run once per request on the API server's hot path. The public
    function itself where the runtime context is another one (``OTEL_PYTHON_CONTEXT``)."""
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and callable(getattr(var, "get", None)) \
            and var.get() is context.get_current():
        return var.get
    return context.get_current


# --- tracing: the provider's processors and the batch processor's exporter and queue -------------
def span_processors(provider: Any) -> tuple[Any, ...] | None:
    """The span processors of an SDK ``TracerProvider`` (``_active_span_processor``).

    Public alternative: none. ``TracerProvider`` only adds processors; the ones vLLM or
    ``opentelemetry-instrument`` added before we load are known to the provider alone. Bounded
    export needs their batch processors, snapshots need the processors that export.
    """
    multi = getattr(provider, "_active_span_processor", None)
    procs = getattr(multi, "_span_processors", None)
    return tuple(procs) if isinstance(procs, (tuple, list)) else None


def batch_processor(processor: Any) -> Any | None:
    """The SDK's shared ``BatchProcessor`` inside a ``BatchSpanProcessor`` (``_batch_processor``).

    Public alternative: ``BatchSpanProcessor.span_exporter`` reads the exporter but cannot replace
    it, and nothing public reaches the queue. ``None``: not a batch processor (a simple one, ours).
    """
    batch = getattr(processor, "_batch_processor", None)
    return batch if batch is not None and hasattr(batch, "_exporter") else None


def wrap_batch_exporter(batch: Any, wrap: Callable[[Any], Any]) -> Any | None:
    """Replace the exporter a batch processor sends to with ``wrap(exporter)`` (``_exporter``).

    Public alternative: a ``BatchSpanProcessor`` of our own around a counting exporter; but the
    exporter and its settings (``OTEL_EXPORTER_*``, ``OTEL_BSP_*``) are the user's, and a second
    processor would send every span twice. Returns the wrapper, ``None`` if there is no exporter.
    """
    return _wrap_exporter(batch, wrap)


def _wrap_exporter(owner: Any, wrap: Callable[[Any], Any]) -> Any | None:
    inner = getattr(owner, "_exporter", None)
    if inner is None:
        return None
    owner._exporter = wrapped = wrap(inner)
    return wrapped


def batch_exporter(batch: Any) -> Any | None:
    """The exporter a batch processor sends to now (``_exporter``; see ``wrap_batch_exporter``)."""
    return getattr(batch, "_exporter", None)


def wrap_queue_metrics(batch: Any, wrap: Callable[[Any], Any]) -> bool:
    """Replace the batch processor's own metrics object, which is told of every item the full
    queue drops (``_metrics.drop_items``), with ``wrap(it)``; False where there is none.

    Public alternative: the SDK's internal metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``:
    ``otel.sdk.processor.span.processed`` with ``error.type=queue_full``): opt-in, on whichever
    meter provider was global when the processor was made, and blind to failed exports and to
    the exit deadline, which ``ttft.telemetry.dropped`` counts as well.
    """
    inner = getattr(batch, "_metrics", None)
    if inner is None or not hasattr(inner, "drop_items"):
        return False
    batch._metrics = wrap(inner)
    return True


def queue_length(batch: Any) -> int:
    """Spans waiting in a batch processor's queue (``_queue``), 0 where unknown.

    Public alternative: none (the SDK's internal queue-size gauge is opt-in and asynchronous);
    read once, when the exit deadline has passed, to count what is abandoned.
    """
    with contextlib.suppress(TypeError):
        return len(getattr(batch, "_queue", ()))
    return 0


def exporter_shut_down(exporter: Any) -> bool:
    """Whether an SDK exporter was shut down already (``_shutdown``).

    Public alternative: none; calling ``shutdown`` again is harmless but logs a warning in every
    OTLP exporter, once per abandoned exporter at exit.
    """
    return bool(getattr(exporter, "_shutdown", False))


def exporter_endpoint(exporter: Any) -> str | None:
    """Where an OTLP exporter sends (``_endpoint``), for the one log line that names it.

    Public alternative: the ``OTEL_EXPORTER_OTLP_*`` settings, which the exporter resolved with
    its defaults and its constructor's arguments; missing, the line names no endpoint.
    """
    endpoint = getattr(exporter, "_endpoint", None)
    return str(endpoint) if endpoint else None


def span_lock(span: Any) -> Any:
    """The lock an SDK span holds while it ends (``Span._lock``); a null lock where none.

    Public alternative: none. A snapshot copy taken under it is queued before the real span if
    that ends meanwhile, so a store that keeps the last copy keeps the finished span.
    """
    lock = getattr(span, "_lock", None)
    return lock if hasattr(lock, "__enter__") else contextlib.nullcontext()


@dataclass(frozen=True, eq=False)
class SpanMaker:
    """What an SDK tracer's ``start_span`` reads to make a span, for spans made finished
    (``telemetry.finished``): sampler, ids, the provider's processors, resource, scope, limits."""

    tracer: Any
    sampler: Any
    id_generator: Any
    processor: Any
    """The provider's ``SynchronousMultiSpanProcessor`` (``on_end`` goes to every processor)."""
    processors: tuple[Any, ...]
    """Its processors when this was read (the provider replaces the tuple to add one)."""
    resource: Any
    scope: Any
    info: Any
    limits: Any
    start_metrics: Callable[[Any, Any], Any]
    """The tracer's own span metrics: ``start_metrics(parent, decision)`` -> what ``end`` calls."""
    static_decisions: tuple[Any, ...] | None = None
    """The sampler's decisions when they follow from the parent alone (``static_decisions``)."""


def real_tracer(tracer: Any) -> Any:
    """The tracer an API ``ProxyTracer`` delegates to now (``_tracer``); any other as it is."""
    return getattr(tracer, "_tracer", tracer)


def span_maker(tracer: Any) -> SpanMaker | None:
    """An enabled SDK tracer's parts (``_tracer`` of an API proxy, ``_is_enabled``,
    ``span_processor._span_processors``, ``_span_limits``, ``_instrumentation_scope``,
    ``_tracer_metrics``); ``None`` for any other tracer, a disabled one, or a provider with a
    concurrent multi-processor.

    Public alternative: ``start_span`` + ``set_attributes`` + ``end``, 30 us for a request span
    of 30 attributes, of which the ``Span`` itself (its lock, each attribute validated and
    copied) is most; a request's spans are finished before they are made, so nothing is lost by
    making the ``ReadableSpan`` its ``end`` would hand to ``on_end`` directly.
    """
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace import Tracer as SdkTracer

    real = real_tracer(tracer)
    if type(real) is not SdkTracer or not real._is_enabled():
        return None
    multi = real.span_processor
    if type(multi) is not SynchronousMultiSpanProcessor:
        return None
    return SpanMaker(real, real.sampler, real.id_generator, multi, tuple(multi._span_processors),
                     real.resource, real._instrumentation_scope, real.instrumentation_info,
                     real._span_limits, real._tracer_metrics.start_span,
                     static_decisions(real.sampler))


def static_decisions(sampler: Any) -> tuple[Any, ...] | None:
    """The decisions of the SDK's always-on/off samplers, alone or under ``ParentBased`` (the
    default: ``parentbased_always_on``), for (no parent, remote sampled, remote not sampled,
    local sampled, local not sampled): they follow from the parent alone, with no attributes and
    the parent's trace state (``StaticSampler._decision``; ``ParentBased._root``,
    ``_remote_parent_sampled``, ...). ``None`` for any other sampler: it is asked.

    Public alternative: ``should_sample`` with a ``Context`` made for the parent, which is most
    of a request span's start (3 us of 4 here, twice the span context looked up in the context).
    """
    from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler

    try:
        if type(sampler) is StaticSampler:
            return (sampler._decision,) * 5
        if type(sampler) is not ParentBased:
            return None
        parts = (sampler._root, sampler._remote_parent_sampled,
                 sampler._remote_parent_not_sampled, sampler._local_parent_sampled,
                 sampler._local_parent_not_sampled)
        if not all(type(part) is StaticSampler for part in parts):
            return None
        return tuple(part._decision for part in parts)
    except AttributeError:  # another SDK: ask the sampler
        return None


def _static_decisions_agree(probe: Probe) -> bool:
    """``static_decision`` says what ``should_sample`` says, for every kind of parent."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

    sampler = ParentBased(ALWAYS_ON, remote_parent_sampled=ALWAYS_ON,
                          remote_parent_not_sampled=ALWAYS_OFF)
    decisions = static_decisions(sampler)
    if decisions is None:
        return False
    parents = [None] + [trace.SpanContext(1, 2, remote, trace.TraceFlags(flags))
                        for remote in (True, False) for flags in (1, 0)]
    for parent in parents:
        context = (trace.set_span_in_context(trace.NonRecordingSpan(parent))
                   if parent is not None else None)
        result = sampler.should_sample(context, 1, "check")
        if result.decision is not static_decision(decisions, parent) or result.attributes:
            return False
    return True


def static_decision(decisions: tuple[Any, ...], parent: Any) -> Any:
    """The decision ``static_decisions`` gives for this parent span context (``None``: none)."""
    if parent is None:
        return decisions[0]
    flags = parent.trace_flags
    return decisions[(1 if parent.is_remote else 3) + (0 if flags.sampled else 1)]


def maker_current(maker: SpanMaker) -> bool:
    """Whether ``maker``'s processors are still the provider's (none added since)."""
    return maker.processor._span_processors == maker.processors


def start_is_noop(processor: Any) -> bool:
    """Whether a processor's ``on_start`` and ``_on_ending`` do nothing (their code is an empty
    body's, as the SDK's batch and simple processors' and the base class's are): it would see
    nothing of a span before its end. A processor without ``_on_ending`` (older SDK) has none."""
    return _starts_nothing(type(processor))


def _starts_nothing(kind: type) -> bool:
    return all(_empty_body(getattr(kind, name, _nothing)) for name in ("on_start", "_on_ending"))


def _nothing(self: Any, span: Any = None, parent_context: Any = None) -> None:
    """An empty body."""


def _empty_body(method: Any) -> bool:
    code = getattr(method, "__code__", None)
    return code is not None and _steps(code) == _steps(_nothing.__code__)


def _steps(code: Any) -> list[tuple[str, Any]]:
    """What a code object does (a docstring or line numbers aside)."""
    import dis

    return [(i.opname, i.argval) for i in dis.get_instructions(code)
            if i.opname not in ("RESUME", "NOP", "CACHE")]


def span_processor_of(span: Any) -> Any | None:
    """The processor an SDK span ends into (``_span_processor``), for its finished children."""
    return getattr(span, "_span_processor", None)


def restamp_start(span: Any, start_ns: int) -> bool:
    """Move an SDK span's start (``_start_time``), from a processor's ``on_start``.

    Public alternative: ``start_span(start_time=...)``, for spans one starts; vLLM's start-up
    spans take the SDK's wall-clock default, and ours must share one clock with them.
    """
    if not isinstance(getattr(span, "_start_time", None), int):
        return False
    span._start_time = start_ns
    return True


def restamp_end(span: Any, end_ns: int) -> bool:
    """Move an SDK span's end (``_end_time``), from ``EndingHook.ending``: before the
    ``ReadableSpan`` that every ``on_end`` gets is made from it. Public alternative: as for
    ``restamp_start``, ``end(end_time=...)`` for spans one ends."""
    if not isinstance(getattr(span, "_end_time", None), int):
        return False
    span._end_time = end_ns
    return True


class EndingHook:
    """Mixin for a span processor: ``ending(span)`` sees a span as it ends, its end time set,
    before any ``on_end`` (the SDK's ``_on_ending``; an SDK without it never calls it).

    Public alternative: none; ``on_end`` gets a ``ReadableSpan`` already shared with the
    processors that export. Put it first among the bases (``SpanProcessor`` has an empty one)."""

    def _on_ending(self, span: Any) -> None:
        self.ending(span)

    def ending(self, span: Any) -> None:
        pass


def stop_shutdown_at_exit(provider: Any) -> None:
    """Take a provider's ``shutdown`` out of ``atexit`` (the SDK registers its bound method, and
    vLLM's ``init_tracer`` its own): bounded export's exit, with a deadline, replaces it.

    Public alternative: ``TracerProvider(shutdown_on_exit=False)``: only for providers one makes,
    and these are made by vLLM or the SDK's configurator.
    """
    with contextlib.suppress(AttributeError):
        atexit.unregister(provider.shutdown)


# --- metrics: the readers' exporters --------------------------------------------------------------
def metric_readers(provider: Any) -> tuple[Any, ...] | None:
    """The metric readers of an SDK ``MeterProvider``: ``_metric_readers`` (1.4x), else
    ``_sdk_config.metric_readers`` (older SDKs; 1.45 no longer has it, and bounded export
    silently left metrics unbounded until ``check`` said so).

    Public alternative: none; readers are given to the constructor (or ``add_metric_reader``) and
    kept private.
    """
    readers = getattr(provider, "_metric_readers", None)
    if readers is None:
        readers = getattr(getattr(provider, "_sdk_config", None), "metric_readers", None)
    return tuple(readers) if isinstance(readers, (tuple, list)) else None


def wrap_reader_exporter(reader: Any, wrap: Callable[[Any], Any]) -> Any | None:
    """Replace a ``PeriodicExportingMetricReader``'s exporter with ``wrap(exporter)``
    (``_exporter``); ``None`` for a reader without one (pull readers, in-memory readers).

    Public alternative: a reader of our own over a counting exporter; but the reader is the user's
    (``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_*``), and two would export everything twice.
    """
    return _wrap_exporter(reader, wrap)


def reader_exporter(reader: Any) -> Any | None:
    """The exporter a metric reader sends to now (``_exporter``; see ``wrap_reader_exporter``)."""
    return getattr(reader, "_exporter", None)


# --- ids: the default id generator ----------------------------------------------------------------
_id_originals: tuple[Any, Any] | None = None


def patch_default_ids(span_id: Callable[[Any], int], trace_id: Callable[[Any], int]) -> None:
    """Make the SDK's ``RandomIdGenerator`` draw ids from these functions, for every instance in
    the process (every tracer of every provider, those made before included); idempotent.

    Public alternative: ``TracerProvider(id_generator=...)`` or ``OTEL_PYTHON_ID_GENERATOR``: only
    for a provider made after we load and by someone who asks; vLLM makes its own provider with
    the default generator, and a tracer keeps its provider's generator instance for good.
    """
    global _id_originals
    if _id_originals is None:
        _id_originals = (RandomIdGenerator.generate_span_id, RandomIdGenerator.generate_trace_id)
        RandomIdGenerator.generate_span_id = span_id
        RandomIdGenerator.generate_trace_id = trace_id


def restore_default_ids() -> None:
    """Undo ``patch_default_ids``."""
    global _id_originals
    if _id_originals is not None:
        RandomIdGenerator.generate_span_id, RandomIdGenerator.generate_trace_id = _id_originals
        _id_originals = None


# --- the distro's configurator --------------------------------------------------------------------
def sdk_configurator() -> type:
    """The SDK's configurator class (``opentelemetry.sdk._configuration._OTelSDKConfigurator``),
    which ``opentelemetry-instrument`` runs to install providers and exporters from ``OTEL_*``.

    Public alternative: ``opentelemetry-distro``'s ``OpenTelemetryConfigurator``, which is this
    same subclass, as one more dependency. Imported on call: only ``opentelemetry-instrument``
    loads the distro, and the module costs tens of milliseconds to import.
    """
    from opentelemetry.sdk._configuration import _OTelSDKConfigurator

    return _OTelSDKConfigurator


# --- histograms: the aggregation Histogram.record would write -------------------------------------
# Public alternative for all of these: ``Histogram.record``, 10-20 us a sample (it cleans, copies
# and hashes the attributes and builds a Measurement) against about 1 us here
# (benchmarks/request_microbench.py); ``hooks/request/histogram.py`` says when each is used.

def histogram_writable(instrument: Any) -> bool:
    """Whether this is the SDK's histogram with the internals below (another SDK's is not)."""
    return _ExplicitBuckets is not None and hasattr(instrument, "_measurement_consumer")


def histogram_storages(instrument: Any) -> Any | None:
    """The readers' storages a histogram's samples go to (``_measurement_consumer
    ._reader_storages``); ``None``: disabled, or not the SDK's histogram (``record`` then).
    The SDK replaces the map when a reader comes or goes: callers compare it by identity."""
    if not instrument._is_enabled():
        return None
    return instrument._measurement_consumer._reader_storages


def histogram_targets(storages: Any, instrument: Any, attributes: Mapping[str, Any]
                      ) -> list[list[Any]] | None:
    """Where one sample with these attributes goes, per reader and view: ``[view match, its
    attribute key, its attributes, the aggregations map seen, the aggregation found]``.
    ``None`` where a View chose another aggregation than explicit buckets (``record`` then).
    Raises AttributeError / TypeError where the internals are not as expected."""
    targets: list[list[Any]] = []
    for storage in storages.values():
        for match in storage._get_or_init_view_instrument_match(instrument):
            if type(match._aggregation) is not _ExplicitBuckets:
                return None  # a View chose another aggregation (or drops it)
            keys = match._view._attribute_keys
            attrs = {k: v for k, v in attributes.items() if keys is None or k in keys}
            targets.append([match, _hash_attributes(attrs), attrs, None, None])
    for match, *_ in targets:  # what ``histogram_add`` uses: checked once, not per sample
        for name in ("_reset_on_collect", "_lock", "_get_or_create_aggregation",
                     "_attributes_aggregation"):
            getattr(match, name)
        for name in ("_lock", "_value", "_sum", "_min", "_max", "_record_min_max",
                     "_boundaries", "_get_empty_bucket_counts"):
            getattr(match._aggregation, name)
        match._aggregation._reservoir.offer  # noqa: B018 - the exemplar offer's target
    exemplar_filter(instrument).should_sample  # noqa: B018
    return targets


def histogram_add(targets: Iterable[list[Any]], value: float,
                  exemplar: tuple[int, Mapping[str, Any], Any] | None = None) -> None:
    """One sample into each target's aggregation, under the SDK's locks: the bucket counts, sum,
    min and max ``record`` would have made; with ``exemplar`` (time in ns, the sample's
    attributes, its context), also the offer to the aggregation's exemplar reservoir
    (``_reservoir``) that ``record`` makes once the exemplar filter said yes."""
    for target in targets:
        match, hashed, attrs, known, aggregation = target
        if match._reset_on_collect:  # delta: a collection swaps the aggregations out
            with match._lock:
                aggregation = match._get_or_create_aggregation(hashed, attrs)
                _aggregate(aggregation, value)
                if exemplar is not None:
                    aggregation._reservoir.offer(value, *exemplar)
            continue
        if known is not match._attributes_aggregation or aggregation is None:
            # Cumulative: the SDK keeps one aggregation per attribute set for good.
            with match._lock:
                aggregation = match._get_or_create_aggregation(hashed, attrs)
                target[3], target[4] = match._attributes_aggregation, aggregation
        _aggregate(aggregation, value)
        if exemplar is not None:
            aggregation._reservoir.offer(value, *exemplar)


def exemplar_filter(instrument: Any) -> Any:
    """The meter provider's exemplar filter (``_measurement_consumer._sdk_config``), which
    ``record`` asks whether a sample offers an exemplar (trace-based by default)."""
    return instrument._measurement_consumer._sdk_config.exemplar_filter


def _aggregate(aggregation: Any, value: float) -> None:
    """What ``_ExplicitBucketHistogramAggregation.aggregate`` does, without the exemplar offer."""
    if type(aggregation) is not _ExplicitBuckets:  # not what the targets checked: give up on it
        raise TypeError(f"unexpected aggregation {type(aggregation).__name__}")
    with aggregation._lock:
        counts = aggregation._value
        if counts is None:
            counts = aggregation._value = aggregation._get_empty_bucket_counts()
        aggregation._sum += value
        if aggregation._record_min_max:
            if value < aggregation._min:
                aggregation._min = value
            if value > aggregation._max:
                aggregation._max = value
        counts[bisect_left(aggregation._boundaries, value)] += 1


# --- the check -----------------------------------------------------------------------------------
@dataclass
class Probe:
    """SDK objects to look for the internals in (``check`` makes real ones)."""

    tracer_provider: Any
    batch_span_processor: Any
    meter_provider: Any
    periodic_reader: Any
    histogram: Any
    span: Any
    span_context: Any
    """A context whose current span is ``span`` (sampled)."""


def _probe() -> tuple[Probe, Callable[[], None]]:
    """Throwaway SDK objects (nothing exported) and what shuts them down (which takes them out
    of ``atexit`` again)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        InMemoryMetricReader,
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    class _Nowhere(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 0, **kwargs: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
            pass

    tracer_provider = TracerProvider()
    batch = BatchSpanProcessor(SpanExporter(), schedule_delay_millis=3_600_000)
    tracer_provider.add_span_processor(batch)
    periodic = PeriodicExportingMetricReader(_Nowhere(), export_interval_millis=3_600_000)
    meter_provider = MeterProvider(metric_readers=[periodic, InMemoryMetricReader()])
    histogram = meter_provider.get_meter("otel_ttft.check").create_histogram("otel_ttft.check")
    span = tracer_provider.get_tracer("otel_ttft.check").start_span("check")
    from opentelemetry import trace

    probe = Probe(tracer_provider, batch, meter_provider, periodic, histogram, span,
                  trace.set_span_in_context(span))

    def close() -> None:
        span.end()
        for provider in (tracer_provider, meter_provider):
            with contextlib.suppress(Exception):
                provider.shutdown()

    return probe, close


def _restamps(p: Probe) -> bool:
    """An ``EndingHook`` sees the span before its ``ReadableSpan`` is made, and the
    times it sets are the ones every ``on_end`` gets."""
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    ended: list[Any] = []

    class Restamp(EndingHook, SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            restamp_start(span, 1_000)

        def ending(self, span: Any) -> None:
            restamp_end(span, 2_000)

        def on_end(self, span: Any) -> None:
            ended.append(span)

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(Restamp())
    provider.get_tracer("otel_ttft.check").start_span("check").end()
    provider.shutdown()
    return [(s.start_time, s.end_time) for s in ended] == [(1_000, 2_000)]


def _histogram_writes(p: Probe) -> bool:
    storages = histogram_storages(p.histogram)
    targets = histogram_targets(storages, p.histogram, {"k": "v"})
    if not targets:
        return False
    histogram_add(targets, 0.5)
    histogram_add(targets, 0.5, (1, {"k": "v"}, p.span_context))
    return exemplar_filter(p.histogram).should_sample(0.5, 1, {}, p.span_context)


_REQUIRED: tuple[tuple[str, Callable[[Probe], Any]], ...] = (
    ("TracerProvider._active_span_processor._span_processors",
     lambda p: len(span_processors(p.tracer_provider) or ()) == 1),
    ("BatchSpanProcessor._batch_processor", lambda p: batch_processor(p.batch_span_processor)),
    ("BatchProcessor._exporter",
     lambda p: batch_exporter(batch_processor(p.batch_span_processor))),
    ("BatchProcessor._metrics.drop_items",
     lambda p: wrap_queue_metrics(batch_processor(p.batch_span_processor), lambda m: m)),
    ("BatchProcessor._queue",
     lambda p: hasattr(getattr(batch_processor(p.batch_span_processor), "_queue", None),
                       "__len__")),
    ("Span._lock", lambda p: hasattr(getattr(p.span, "_lock", None), "__enter__")),
    ("TracerProvider / MeterProvider register their bound shutdown with atexit",
     lambda p: all(getattr(provider, "_atexit_handler", None) == provider.shutdown
                   for provider in (p.tracer_provider, p.meter_provider))),
    ("MeterProvider._metric_readers (or _sdk_config.metric_readers)",
     lambda p: len(metric_readers(p.meter_provider) or ()) == 2),
    ("PeriodicExportingMetricReader._exporter", lambda p: reader_exporter(p.periodic_reader)),
    ("opentelemetry.context._RUNTIME_CONTEXT._current_context (a ContextVarsRuntimeContext)",
     lambda p: current_context_getter() is not __import__(
         "opentelemetry.context", fromlist=["x"]).get_current),
    ("TracerProvider.id_generator is a RandomIdGenerator by default",
     lambda p: isinstance(getattr(p.tracer_provider, "id_generator", None), RandomIdGenerator)),
    ("sdk._configuration._OTelSDKConfigurator", lambda p: callable(sdk_configurator())),
    ("Tracer._tracer_metrics, _span_limits, _instrumentation_scope, _is_enabled; "
     "span_processor._span_processors",
     lambda p: span_maker(p.tracer_provider.get_tracer("otel_ttft.check")) is not None),
    ("StaticSampler._decision; ParentBased._root, _remote_parent_sampled, "
     "_remote_parent_not_sampled, _local_parent_sampled, _local_parent_not_sampled",
     _static_decisions_agree),
    ("BatchSpanProcessor.on_start / _on_ending do nothing", lambda p: _starts_nothing(
        __import__("opentelemetry.sdk.trace.export", fromlist=["x"]).BatchSpanProcessor)),
    ("Span._span_processor", lambda p: span_processor_of(p.span) is not None),
    ("Span._start_time, _end_time; SpanProcessor._on_ending before on_end", _restamps),
    ("metrics._internal: _ExplicitBucketHistogramAggregation, _hash_attributes",
     lambda p: _ExplicitBuckets is not None),
    ("Histogram._measurement_consumer._reader_storages -> explicit-bucket aggregation "
     "(its _reservoir; _sdk_config.exemplar_filter)",
     _histogram_writes),
)


def check(probe: Probe | None = None) -> list[str]:
    """The SDK internals above that ``probe`` (default: fresh objects of the installed SDK)
    lacks; empty where all are there. Where one is missing its caller falls back to the SDK's
    own behaviour: exports unbounded at exit, no drop counts, ``Histogram.record``, ..."""
    close: Callable[[], None] = lambda: None
    if probe is None:
        probe, close = _probe()
    missing = []
    try:
        for name, present in _REQUIRED:
            try:
                ok = present(probe)
            except Exception:  # noqa: BLE001 - whatever moved, it is missing
                ok = False
            if not ok:
                missing.append(name)
    finally:
        close()
    return missing
