"""Which requests get a span, and which their stage children: the request-detail policy
(``OTEL_TTFT_REQUEST_DETAIL``, ``docs/server.md``). Every request is counted in our metrics; a
span costs far more than a request's hooks and samples together, so by default (``auto``) spans
with children go to the requests someone will open (cold, slow, the model's tail, failed, a
sampled share) and to those the caller traces; the sampler still has the last word.
"""

from __future__ import annotations

import os
import random
from typing import Any

from otel_ttft import semconv

_TAIL_WINDOW = 256
_TAIL_EVERY = 32  # the tail threshold is re-read from the window every this many requests
_RATIO_BITS = 1 << 56


class _Tail:
    """The latest TTFTs of one model and the p99 of them, recomputed every few requests."""

    __slots__ = ("values", "count", "threshold", "credit")

    def __init__(self) -> None:
        self.values: list[float] = []
        self.count = 0
        self.threshold: float | None = None
        self.credit = 1.0  # tail requests still allowed: at most 1 % of all, bursts of 8

    def above(self, ttft: float) -> bool:
        """Whether ``ttft`` is in the tail of the requests before it; then remembers it. A load
        spike puts every request above the old p99: the credit keeps that to 1 % of requests
        (the slow threshold still catches every slow one)."""
        self.credit = min(self.credit + 1 - semconv.REQUEST_DETAIL_TAIL_QUANTILE, 8.0)
        above = self.threshold is not None and ttft > self.threshold and self.credit >= 1
        if above:
            self.credit -= 1
        if len(self.values) < _TAIL_WINDOW:
            self.values.append(ttft)
        else:
            self.values[self.count % _TAIL_WINDOW] = ttft
        self.count += 1
        if self.count % _TAIL_EVERY == 0:
            ordered = sorted(self.values)
            self.threshold = ordered[int(semconv.REQUEST_DETAIL_TAIL_QUANTILE * (len(ordered) - 1))]
        return above


class DetailPolicy:
    """The policy as configured, with each model's tail and the private sampling draw."""

    def __init__(self, config: Any) -> None:
        self.mode: str = config.request_detail
        self.slow_s: float = config.detail_slow_s
        self.ratio: float = config.detail_ratio
        self.tails: dict[str | None, _Tail] = {}
        self.draw = random.Random(os.urandom(16))  # vLLM seeds the global ``random``

    def reason(self, *, cold: bool, ttft: float | None, failed: bool,
               model: str | None) -> str | None:
        """Why this request's children are built, or None (then maybe sampled:
        ``sampled``)."""
        if self.mode == semconv.DETAIL_ALL:
            return semconv.DETAIL_ALL
        if self.mode == semconv.DETAIL_NONE:
            return None  # (``spans`` and ``auto`` share the reasons below)
        tail = self.tails.get(model)
        if tail is None:
            if len(self.tails) >= 1024:  # models come and go (LoRA names): keep the map bounded
                self.tails.clear()
            tail = self.tails[model] = _Tail()
        in_tail = ttft is not None and tail.above(ttft)
        if cold:
            return semconv.DETAIL_COLD
        if failed or ttft is None:
            return semconv.DETAIL_ERROR
        if ttft >= self.slow_s:
            return semconv.DETAIL_SLOW
        if in_tail:
            return semconv.DETAIL_TAIL
        return None

    def sampled(self, trace_id: int | None) -> bool:
        """The sampled share of the requests without a reason: by the caller's trace id when it
        traces the request (the low 56 bits, random in W3C trace ids, so every party agrees),
        else a private random draw."""
        if self.mode not in (semconv.DETAIL_AUTO, semconv.DETAIL_SPANS) or not self.ratio:
            return False
        if trace_id is None:
            return self.draw.random() < self.ratio
        return (trace_id % _RATIO_BITS) < self.ratio * _RATIO_BITS

    def wants_span(self, detail: str | None, *, traced: bool) -> bool:
        """Whether this request gets its ``llm_request`` span: it has a reason to be opened
        (``detail``), its caller traces it, or the policy asks for every request's span."""
        return detail is not None or traced or self.mode == semconv.DETAIL_SPANS
