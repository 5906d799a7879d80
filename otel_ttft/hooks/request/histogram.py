"""A histogram sample for about 1 us instead of the SDK's 10-20 us: the TTFT sample of a request.

``Histogram.record`` cleans, copies and hashes the attributes and builds a ``Measurement`` for
every sample (opentelemetry-sdk 1.45 on the 2-core VM: 5 us bare, 12 us with the four attributes
TTFT carries), more than our hooks cost a request together. TTFT is recorded once per request,
always with one of a few attribute sets, into the SDK's default aggregation for a histogram
(explicit buckets). So ``SampleWriter`` adds the sample to the aggregation the SDK itself keeps
for that attribute set in each reader, found once per set: the bucket counts, sum, min and max
``record`` would have made, under the same locks, collected and exported by the SDK as usual.

Everything else goes through ``record``: a sample with an exemplar to offer (a request with a
span: the trace-based filter would keep it), a value ``record`` would warn about, a disabled
meter, another SDK or a View that aggregates the instrument otherwise. This reads SDK internals
(``_measurement_consumer`` down to the aggregation's fields), checked against the public
``record`` by ``tests/test_request_histogram.py``; if they ever differ from what is expected, it
logs once and stays on ``record`` for good.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("otel_ttft")

try:  # the SDK's default histogram aggregation and its attribute key
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.aggregation import (
        _ExplicitBucketHistogramAggregation as _ExplicitBuckets,
    )
except ImportError:  # pragma: no cover - another SDK version: ``record`` only
    _hash_attributes = _ExplicitBuckets = None  # type: ignore[assignment,misc]


class SampleWriter:
    """Writes samples of one SDK histogram straight into its explicit-bucket aggregations."""

    __slots__ = ("instrument", "_storages", "_targets", "_broken")

    def __init__(self, instrument: Any):
        self.instrument = instrument
        self._storages: Any = None  # the SDK's readers' storages the targets were found in
        # attribute set -> [view match, its key, its attributes, the match's aggregations map
        # and the aggregation found in it] per reader and view; None: through ``record``
        self._targets: dict[Any, list[list[Any]] | None] = {}
        self._broken = _ExplicitBuckets is None or not hasattr(instrument, "_measurement_consumer")

    def record(self, value: float, attributes: Mapping[str, Any], key: Any) -> None:
        """One sample; ``key``: a hashable name of ``attributes`` (the caller's cache key)."""
        if self._broken or not 0 <= value < math.inf:
            self.instrument.record(value, attributes)
            return
        try:
            targets = self._find(attributes, key)
            if targets is None:
                self.instrument.record(value, attributes)
                return
            for target in targets:
                match, hashed, attrs, known, aggregation = target
                if match._reset_on_collect:  # delta: a collection swaps the aggregations out
                    with match._lock:
                        _add(match._get_or_create_aggregation(hashed, attrs), value)
                    continue
                if known is not match._attributes_aggregation or aggregation is None:
                    # Cumulative: the SDK keeps one aggregation per attribute set for good.
                    with match._lock:
                        aggregation = match._get_or_create_aggregation(hashed, attrs)
                        target[3], target[4] = match._attributes_aggregation, aggregation
                _add(aggregation, value)
        except Exception as exc:  # noqa: BLE001 - SDK internals not as expected: the public API
            self._broken = True
            logger.info("otel-ttft: writing histogram samples directly is unavailable (%r); "
                        "using Histogram.record", exc)
            self.instrument.record(value, attributes)

    def _find(self, attributes: Mapping[str, Any], key: Any) -> list[list[Any]] | None:
        """Where a sample with these attributes goes in every reader (None: through ``record``).
        Found again when a reader comes or goes (the SDK then replaces its storages' map)."""
        instrument = self.instrument
        if not instrument._is_enabled():
            return None
        storages = instrument._measurement_consumer._reader_storages
        if storages is not self._storages:
            self._storages, self._targets = storages, {}
        try:
            return self._targets[key]
        except KeyError:
            pass
        targets: list[list[Any]] | None = []
        for storage in storages.values():
            for match in storage._get_or_init_view_instrument_match(instrument):
                if type(match._aggregation) is not _ExplicitBuckets:
                    targets = None  # a View chose another aggregation (or drops it)
                    break
                keys = match._view._attribute_keys
                attrs = {k: v for k, v in attributes.items() if keys is None or k in keys}
                targets.append([match, _hash_attributes(attrs), attrs, None, None])
            if targets is None:
                break
        if targets:
            for match, *_ in targets:  # what ``_add`` writes: checked once, not per sample
                aggregation = match._aggregation
                for name in ("_lock", "_value", "_sum", "_min", "_max", "_record_min_max",
                             "_boundaries", "_get_empty_bucket_counts"):
                    getattr(aggregation, name)
        self._targets[key] = targets
        return targets


def _add(aggregation: Any, value: float) -> None:
    """What ``_ExplicitBucketHistogramAggregation.aggregate`` does, without the exemplar offer."""
    if type(aggregation) is not _ExplicitBuckets:  # not what ``_find`` checked: give up on it
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
