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
meter, another SDK or a View that aggregates the instrument otherwise. The SDK internals this
reads (``_measurement_consumer`` down to the aggregation's fields) are in ``sdk_internals``,
checked against the public ``record`` by ``tests/test_request_histogram.py``; if they ever
differ from what is expected, it logs once and stays on ``record`` for good.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from otel_ttft.runtime.telemetry import sdk_internals

logger = logging.getLogger("otel_ttft")


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
            sdk_internals.histogram_add(targets, value)
        except Exception as exc:  # noqa: BLE001 - SDK internals not as expected: the public API
            self._broken = True
            logger.info("otel-ttft: writing histogram samples directly is unavailable (%r); "
                        "using Histogram.record", exc)
            self.instrument.record(value, attributes)

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
