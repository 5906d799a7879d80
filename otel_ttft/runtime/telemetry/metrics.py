"""The activation stage instruments (buckets far above the SDK's 10 s: a cold start takes
minutes), and each stage's duration in the process's latest activation as a gauge read at export
time, which an alert compares with the model's history (activations are too rare for a rate).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from otel_ttft import semconv
from otel_ttft.runtime import config, ranks
from otel_ttft.version import __version__


# --- observable instruments: one callback per provider, fed by the part open now ----------------
class GaugeFeed:
    """The one callback of one observable instrument on one meter provider. The OTel API cannot
    unregister a callback, and the SDK keeps the first instrument of a name (a second one's
    callbacks are ignored): so each is registered once per provider and reads whichever
    part feeds it now (``source``); with none (uninstrumented), it yields nothing."""

    def __init__(self) -> None:
        self.source: Callable[[CallbackOptions], Iterable[Observation]] | None = None

    def __call__(self, options: CallbackOptions) -> Iterable[Observation]:
        source = self.source
        return source(options) if source is not None else ()


_feeds: dict[tuple[int, str], tuple[Any, GaugeFeed]] = {}
"""(id of a meter provider, instrument name) -> (that provider, its feed): what was registered on
providers, which outlive an instrumentation (a registration cannot be taken back)."""


def observable(cfg: config.Config, name: str, source: Callable[..., Any], *,
               counter: bool = False, **kwargs: Any) -> GaugeFeed:
    """The observable gauge (``counter``: counter) ``name`` on ``cfg``'s meter provider, fed by
    ``source`` from now on (registered on first use of that provider; the part stops feeding it
    when it closes)."""
    provider = config.meter_provider(cfg)
    key = (id(provider), name)
    found = _feeds.get(key)
    if found is None or found[0] is not provider:
        feed = GaugeFeed()
        meter = metrics.get_meter("otel_ttft", __version__, meter_provider=provider)
        create = meter.create_observable_counter if counter else meter.create_observable_gauge
        create(name, callbacks=[feed], **kwargs)
        _feeds[key] = found = (provider, feed)
    found[1].source = source
    return found[1]


def stop_feeding(feed: GaugeFeed, source: Callable[..., Any]) -> None:
    """``source`` no longer feeds ``feed`` (unless a newer part took it over already)."""
    if feed.source == source:
        feed.source = None


class StageMetrics:
    """The ``stage_metrics`` part: the activation stage instruments, and what the
    latest-activation gauges read: ``last`` ((stage, model) -> [trace id of the activation,
    longest span of that stage in it, seconds]) and ``compiles`` (model -> [trace id, compile
    spans, cache hits]). Fed by the stage tagger as staged spans end, and by the shard reads.
    ``identity``: the process's, whose served model labels a stage that ended before it was
    known, and whose kind the stage tagger puts on vLLM's spans."""

    def __init__(self, process_state: Any) -> None:
        global _open_state
        self.config: config.Config = process_state.config
        self.identity = process_state.identity
        ours = process_state.meter
        self.activation = ours.create_histogram(
            semconv.METRIC_ACTIVATION_STAGE_DURATION, unit="s",
            description="Duration of one engine-activation stage span (start, wake, adapter load)",
            explicit_bucket_boundaries_advisory=list(semconv.ACTIVATION_DURATION_BUCKETS_S))
        self.read_bytes = ours.create_counter(
            semconv.METRIC_LOAD_READ_BYTES, unit="By",
            description="Checkpoint bytes read while loading weights")
        self.read_throughput = ours.create_histogram(
            semconv.METRIC_LOAD_READ_THROUGHPUT, unit="GBy/s",
            description="Checkpoint read throughput per shard",
            explicit_bucket_boundaries_advisory=list(semconv.THROUGHPUT_BUCKETS_GB_PER_S))
        self.last: dict[tuple[str, str | None], list] = {}
        self.compiles: dict[str | None, list] = {}
        self.last_feed = observable(
            self.config, semconv.METRIC_ACTIVATION_STAGE_LAST_DURATION, self.observe_last,
            unit="s", description="Duration of each stage in this process's latest activation "
                                  "(its longest span of that stage)")
        self.compile_feed = observable(
            self.config, semconv.METRIC_ACTIVATION_COMPILE_CACHE_HIT_RATIO, self.observe_compile,
            unit="1", description="Fraction of torch.compile spans in this process's latest "
                                  "activation that loaded their artifacts from the cache")
        _open_state = self

    def close(self) -> None:
        global _open_state
        stop_feeding(self.last_feed, self.observe_last)
        stop_feeding(self.compile_feed, self.observe_compile)
        if _open_state is self:
            _open_state = None

    def record_activation_stage(self, stage: str, seconds: float, model: str | None,
                                trace_id: int | None = None,
                                cache_hit: bool | None = None) -> None:
        """One finished stage span. ``trace_id`` (the activation's trace) lets the
        latest-activation gauges start afresh when a new activation (a wake-up) begins in this
        process; ``cache_hit`` is a torch.compile span's ``ttft.compile.cache_hit``."""
        self.activation.record(seconds, _attrs(stage, model))
        if cache_hit is not None:
            compiles = self.compiles.get(model)
            if compiles is None or compiles[0] != trace_id:
                compiles = self.compiles[model] = [trace_id, 0, 0]
            compiles[1] += 1
            compiles[2] += bool(cache_hit)
        entry = self.last.get((stage, model))
        if entry is None or entry[0] != trace_id:
            self.last[(stage, model)] = [trace_id, seconds]
        elif seconds > entry[1]:
            entry[1] = seconds

    def record_shard_read(self, nbytes: int, gb_per_s: float | None, model: str | None) -> None:
        attrs = _attrs(semconv.STAGE_LOAD_READ, model)
        self.read_bytes.add(nbytes, attrs)
        if gb_per_s is not None:
            self.read_throughput.record(gb_per_s, attrs)

    def observe_last(self, options: CallbackOptions) -> list[Observation]:
        # a stage that ended before the model was known (its process start) belongs to the
        # model served, read now: the series of one activation all carry the model label
        merged: dict[tuple[str, str | None], float] = {}
        for (stage, model), (_trace, seconds) in list(self.last.items()):
            key = (stage, model or self.identity.served_model)
            merged[key] = max(seconds, merged.get(key, 0.0))
        return [Observation(seconds, _attrs(stage, model))
                for (stage, model), seconds in merged.items()]

    def observe_compile(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(hits / total, _attrs(None, model or self.identity.served_model))
                for model, (_trace, total, hits) in list(self.compiles.items()) if total]


PART = "stage_metrics"

_open_state: StageMetrics | None = None
"""The open part, for the one caller no part can be handed to: the stage tagger, a span
processor of our configurator's provider, which outlives any one instrumentation (and records
into nothing, and tags no process kind, while none is open)."""


def _attrs(stage: str | None, model: str | None) -> dict[str, str | int]:
    out: dict[str, str | int] = dict(ranks.metric_labels())  # a worker's: which rank it is
    if stage:
        out[semconv.ATTR_STAGE] = stage
    if model:
        out[semconv.GEN_AI_REQUEST_MODEL] = model
    return out


def open_part() -> StageMetrics | None:
    """The open part, if any (for the stage tagger)."""
    return _open_state
