"""Which requests get their stage child spans: the request-detail policy.

Every request keeps its ``llm_request`` span with its TTFT stages as duration attributes
(``ttft.request.stage.<stage>.seconds``): enough for the metrics, the dashboards and ``analyze``.
The children (one span per stage segment, warm-up paid inside the request, the first decode) cost
several times the request span to build, encode and send, so by default (``auto``) they are built
only for the requests someone will open: cold ones (the first requests after an activation, or
one that waited for a compile or an adapter), slow ones (TTFT above
``OTEL_TTFT_REQUEST_DETAIL_SLOW_MS``), the model's tail (above its running p95 over its latest
256 requests), failed or aborted ones, and a sampled share of the rest
(``OTEL_TTFT_REQUEST_DETAIL_RATIO``, decided by trace id so that every process agrees). ``all``:
every request; ``none``: never. The configured sampler decides first: a request span that is
not recording gets no children either. Settings: ``config.current`` (``request_detail``,
``detail_slow_s``, ``detail_ratio``), read when instrumenting.
"""

from __future__ import annotations

from otel_ttft import config, semconv

_TAIL_WINDOW = 256
_TAIL_EVERY = 32  # the tail threshold is re-read from the window every this many requests
_RATIO_BITS = 1 << 56


class _Tail:
    """The latest TTFTs of one model and the p95 of them, recomputed every few requests."""

    __slots__ = ("values", "count", "threshold", "credit")

    def __init__(self) -> None:
        self.values: list[float] = []
        self.count = 0
        self.threshold: float | None = None
        self.credit = 0.0  # tail requests still allowed: at most 5 % of all, bursts of 8

    def above(self, ttft: float) -> bool:
        """Whether ``ttft`` is in the tail of the requests before it; then remembers it. A load
        spike puts every request above the old p95: the credit keeps that to 5 % of requests
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


_tails: dict[str | None, _Tail] = {}


def reason(*, cold: bool, ttft: float | None, failed: bool, model: str | None) -> str | None:
    """Why this request's children are built, or None (then maybe sampled: ``sampled``)."""
    s = config.current
    if s.request_detail == semconv.DETAIL_ALL:
        return semconv.DETAIL_ALL
    if s.request_detail == semconv.DETAIL_NONE:
        return None
    tail = _tails.get(model)
    if tail is None:
        if len(_tails) >= 1024:  # models come and go (LoRA names): keep the map bounded
            _tails.clear()
        tail = _tails[model] = _Tail()
    in_tail = ttft is not None and tail.above(ttft)
    if cold:
        return semconv.DETAIL_COLD
    if failed or ttft is None:
        return semconv.DETAIL_ERROR
    if ttft >= s.detail_slow_s:
        return semconv.DETAIL_SLOW
    if in_tail:
        return semconv.DETAIL_TAIL
    return None


def sampled(trace_id: int) -> bool:
    """The sampled share, by trace id (the low 56 bits, random in W3C trace ids)."""
    s = config.current
    return s.request_detail == semconv.DETAIL_AUTO and \
        (trace_id % _RATIO_BITS) < s.detail_ratio * _RATIO_BITS


def reset() -> None:
    """Forget every model's tail (tests)."""
    _tails.clear()
