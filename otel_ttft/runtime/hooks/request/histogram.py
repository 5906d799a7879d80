"""A histogram sample for about 1 us instead of the SDK's 10-20 us: the TTFT sample of a request.

``Histogram.record`` cleans, copies and hashes the attributes and builds a ``Measurement`` for
every sample (opentelemetry-sdk 1.45 on the 2-core VM: 5 us bare, 12 us with the four attributes
TTFT carries), more than our hooks cost a request together. TTFT is recorded once per request,
always with one of a few attribute sets, into the SDK's default aggregation for a histogram
(explicit buckets). So ``SampleWriter`` adds the sample to the aggregation the SDK itself keeps
for that attribute set in each reader, found once per set: the bucket counts, sum, min and max
``record`` would have made, under the same locks, collected and exported by the SDK as usual.

Each sample is offered to the aggregation's exemplar reservoir as ``record`` offers it, when the
meter provider's exemplar filter says so (the default, trace-based one: a request with a sampled
span), so the histogram still leads to the trace.
Everything else goes through ``record``: a value ``record`` would warn about, a disabled meter,
another SDK or a View that aggregates the instrument otherwise. The SDK internals this
reads (``_measurement_consumer`` down to the aggregation's fields) are in ``sdk_internals``,
checked against the public ``record`` by ``tests/test_request_histogram.py``; if they ever
differ from what is expected, it logs once and stays on ``record`` for good.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import TraceBasedExemplarFilter

from otel_ttft.runtime.telemetry import sdk_internals

logger = logging.getLogger("otel_ttft")


_NO_SPAN = Context()


class SampleWriter:
    """Writes samples of one SDK histogram straight into its explicit-bucket aggregations."""

    __slots__ = ("instrument", "_storages", "_targets", "_broken")

    def __init__(self, instrument: Any):
        self.instrument = instrument
        self._storages: Any = None  # the SDK's readers' storages the targets were found in
        # attribute set -> where its samples go (``sdk_internals.histogram_targets``) or None:
        # through ``record``
        self._targets: dict[Any, list[list[Any]] | None] = {}
        self._broken = not sdk_internals.histogram_writable(instrument)  # ``record`` only

    def record(self, value: float, attributes: Mapping[str, Any], key: Any,
               context: Any = None) -> None:
        """One sample; ``key``: a hashable name of ``attributes`` (the caller's cache key);
        ``context``: the sample's, for the exemplar filter (``None``: one without a span)."""
        if self._broken or not 0 <= value < math.inf:
            self.instrument.record(value, attributes, context=context or _NO_SPAN)
            return
        try:
            targets = self._find(attributes, key)
            if targets is None:
                self.instrument.record(value, attributes, context=context or _NO_SPAN)
                return
            sdk_internals.histogram_add(targets, value, self._exemplar(value, attributes,
                                                                       context))
        except Exception as exc:  # noqa: BLE001 - SDK internals not as expected: the public API
            self._broken = True
            logger.info("otel-ttft: writing histogram samples directly is unavailable (%r); "
                        "using Histogram.record", exc)
            self.instrument.record(value, attributes, context=context or _NO_SPAN)

    def _exemplar(self, value: float, attributes: Mapping[str, Any], context: Any
                  ) -> tuple[int, Mapping[str, Any], Any] | None:
        """What the exemplar offer needs, if the provider's exemplar filter takes this sample
        (the default, trace-based filter never takes one without a span: not asked then)."""
        exemplar_filter = sdk_internals.exemplar_filter(self.instrument)
        if context is None:
            if type(exemplar_filter) is TraceBasedExemplarFilter:
                return None
            context = _NO_SPAN
        now = time.time_ns()
        if exemplar_filter.should_sample(value, now, attributes, context):
            return now, attributes, context
        return None

    def _find(self, attributes: Mapping[str, Any], key: Any) -> list[list[Any]] | None:
        """Where a sample with these attributes goes in every reader (None: through ``record``).
        Found again when a reader comes or goes (the SDK then replaces its storages' map)."""
        storages = sdk_internals.histogram_storages(self.instrument)
        if storages is None:
            return None
        if storages is not self._storages:
            self._storages, self._targets = storages, {}
        try:
            return self._targets[key]
        except KeyError:
            pass
        targets = sdk_internals.histogram_targets(storages, self.instrument, attributes)
        self._targets[key] = targets
        return targets
