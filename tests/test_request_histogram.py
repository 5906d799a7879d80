"""``SampleWriter`` against the SDK's own ``Histogram.record``: two providers set up alike, one fed
through each, must export the same histogram points (attributes, count, sum, buckets, min, max),
for every way a user can set up readers and views; where it cannot write directly it must fall
back to ``record``, and if the SDK's internals surprise it, log once and keep every sample."""

from __future__ import annotations

import logging
import random

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    Histogram,
    MeterProvider,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import (
    DropAggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request.histogram import SampleWriter
from otel_ttft.runtime.telemetry import sdk_internals

DELTA = {Histogram: AggregationTemporality.DELTA}
ATTRS = [
    {"gen_ai.request.model": m, "ttft.request.cold": c, "gen_ai.operation.name": op,
     "gen_ai.provider.name": "vllm"}
    for m in ("tiny", "other") for c in (False, True) for op in ("chat", "text_completion")]


def _points(reader: InMemoryMetricReader) -> list[tuple]:
    data = reader.get_metrics_data()
    out = []
    for rm in (data.resource_metrics if data else ()):
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    buckets = getattr(p, "bucket_counts", None)
                    if buckets is None:  # exponential: compare what it has
                        buckets = (p.positive.offset, tuple(p.positive.bucket_counts))
                    exemplars = tuple(sorted(
                        (e.value, e.trace_id, e.span_id, tuple(sorted((e.filtered_attributes
                                                                       or {}).items())))
                        for e in getattr(p, "exemplars", ())))
                    out.append((metric.name, tuple(sorted(p.attributes.items())), p.count,
                                round(p.sum, 9), tuple(buckets), p.min, p.max, exemplars))
    return sorted(out)


def _side(readers: list[dict], views: tuple, **provider_args) -> tuple:
    rs = [InMemoryMetricReader(**kw) for kw in readers]
    provider = MeterProvider(metric_readers=rs, views=list(views), **provider_args)
    hist = provider.get_meter("t").create_histogram(
        semconv.METRIC_SERVER_TTFT, unit="s",
        explicit_bucket_boundaries_advisory=list(semconv.TTFT_BUCKETS_S))
    return provider, rs, hist


def _pair(readers: list[dict], views: tuple = (), **provider_args) -> tuple:
    """Two providers, alike: (their readers, the public histogram, the writer's histogram)."""
    _, public_readers, public = _side(readers, views, **provider_args)
    _, direct_readers, direct = _side(readers, views, **provider_args)
    return public_readers, public, direct_readers, SampleWriter(direct)


def _span_context(rng: random.Random, sampled: bool):
    span = trace.NonRecordingSpan(trace.SpanContext(
        rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, False,
        trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else 0)))
    return trace.set_span_in_context(span)


def _feed(public, writer: SampleWriter, n: int, seed: int) -> None:
    """Samples without a span (as an untraced request's), with a sampled one and with an
    unsampled one (a traced request's: its exemplar leads to the trace)."""
    rng = random.Random(seed)
    for _ in range(n):
        i = rng.randrange(len(ATTRS))
        value = rng.choice((rng.expovariate(10), rng.uniform(0, 1200), 0.0, 0.001, 10.0))
        kind = rng.randrange(3)
        context = None if kind == 0 else _span_context(rng, sampled=kind == 1)
        public.record(value, ATTRS[i], context=context or Context())
        writer.record(value, ATTRS[i], i, context)


SETUPS = {
    "one cumulative reader": ([{}], ()),
    "delta reader": ([{"preferred_temporality": DELTA}], ()),
    "cumulative and delta readers": ([{}, {"preferred_temporality": DELTA}], ()),
    "view keeps some attributes": (
        [{}], (View(instrument_name=semconv.METRIC_SERVER_TTFT,
                    attribute_keys={"gen_ai.request.model"}),)),
    "view with other buckets": (
        [{"preferred_temporality": DELTA}],
        (View(instrument_name=semconv.METRIC_SERVER_TTFT,
              aggregation=ExplicitBucketHistogramAggregation((0.1, 1.0, 10.0))),)),
    "view with an exponential histogram": (
        [{}], (View(instrument_name=semconv.METRIC_SERVER_TTFT,
                    aggregation=ExponentialBucketHistogramAggregation()),)),
    "view drops it": ([{}], (View(instrument_name=semconv.METRIC_SERVER_TTFT,
                                  aggregation=DropAggregation()),)),
    "cardinality limit overflows": (
        [{}], (View(instrument_name=semconv.METRIC_SERVER_TTFT,
                    aggregation_cardinality_limit=3),)),
}


@pytest.mark.parametrize("name", list(SETUPS))
def test_exports_what_record_exports(name: str) -> None:
    readers, views = SETUPS[name]
    public_readers, public, direct_readers, writer = _pair(readers, views)
    for round_ in range(4):  # several collections: delta readers swap aggregations out
        _feed(public, writer, 200, seed=round_)
        for a, b in zip(public_readers, direct_readers, strict=True):
            points = _points(b)
            assert points == _points(a)
            if name != "view drops it":  # traced samples lead to their traces
                assert any(point[-1] for point in points)
    if name in ("view with an exponential histogram", "view drops it"):
        assert all(t is None for t in writer._targets.values())  # through ``record``
    else:
        assert writer._targets and all(writer._targets.values())  # written directly
    assert not writer._broken


@pytest.mark.parametrize("exemplar_filter", [AlwaysOnExemplarFilter(),
                                             AlwaysOffExemplarFilter()])
def test_exemplars_follow_the_providers_filter(exemplar_filter) -> None:
    public_readers, public, direct_readers, writer = _pair(
        [{}, {"preferred_temporality": DELTA}], exemplar_filter=exemplar_filter)
    for round_ in range(3):
        _feed(public, writer, 200, seed=round_)
        for a, b in zip(public_readers, direct_readers, strict=True):
            points = _points(b)
            assert points == _points(a)
            assert any(point[-1] for point in points) == (
                type(exemplar_filter) is AlwaysOnExemplarFilter)
    assert writer._targets and all(writer._targets.values())


def test_a_reader_added_later_gets_the_samples_after_it() -> None:
    public_provider, public_readers, public = _side([{}], ())
    direct_provider, direct_readers, direct = _side([{}], ())
    writer = SampleWriter(direct)
    _feed(public, writer, 50, seed=1)
    late = [InMemoryMetricReader(), InMemoryMetricReader()]
    public_provider.add_metric_reader(late[0])
    direct_provider.add_metric_reader(late[1])
    _feed(public, writer, 50, seed=2)
    assert _points(late[1]) == _points(late[0]) and _points(late[0])
    assert _points(direct_readers[0]) == _points(public_readers[0])
    public_provider.remove_metric_reader(public_readers[0])
    direct_provider.remove_metric_reader(direct_readers[0])
    _feed(public, writer, 50, seed=3)
    assert _points(late[1]) == _points(late[0])


def test_values_record_would_warn_about_go_through_record(caplog) -> None:
    public_readers, public, direct_readers, writer = _pair([{}])
    for value in (-1.0, float("inf"), float("nan"), 0.5):
        public.record(value, ATTRS[0])
        writer.record(value, ATTRS[0], 0)
    assert _points(direct_readers[0]) == _points(public_readers[0])
    assert _points(direct_readers[0])[0][2] == 1  # only 0.5 was counted


def test_a_disabled_meter_records_nothing() -> None:
    _, _, direct_readers, writer = _pair([{}])
    writer.instrument._meter_config = type("Off", (), {"is_enabled": False})()
    writer.record(0.5, ATTRS[0], 0)
    assert _points(direct_readers[0]) == []


def test_unexpected_internals_log_once_and_keep_every_sample(caplog) -> None:
    public_readers, public, direct_readers, writer = _pair([{}])
    _feed(public, writer, 20, seed=3)
    writer._targets[0] = [[object(), None, {}, None, None]]  # an SDK with other internals
    writer._storages = sdk_internals.histogram_storages(writer.instrument)
    with caplog.at_level(logging.INFO, logger="otel_ttft"):
        _feed(public, writer, 100, seed=4)
    assert writer._broken
    assert sum("histogram samples directly" in r.message for r in caplog.records) == 1
    assert _points(direct_readers[0]) == _points(public_readers[0])


def test_an_instrument_of_another_sdk_goes_through_record() -> None:
    seen = []

    class Other:
        def record(self, value, attributes=None, context=None):
            seen.append((value, dict(attributes)))

    writer = SampleWriter(Other())
    writer.record(0.25, ATTRS[1], 1)
    assert seen == [(0.25, ATTRS[1])]
