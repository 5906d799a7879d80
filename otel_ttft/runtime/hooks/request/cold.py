"""Which activation a request may have paid for: the first ``cold_requests`` requests after an
activation (start, wake-up, switch) in this process count as cold."""

from __future__ import annotations

from typing import Any

from otel_ttft.runtime import config
from otel_ttft.runtime.hooks import activation

_counted: Any = None  # the activation being counted (each is a new object)
_count = 0


def count() -> tuple[Any, int, bool]:
    """A request arrived: the latest activation (``None`` before the first), the request's
    position among the requests since (1 = first; 0 without one) and whether that makes it
    cold. Called once for every request, record or not."""
    global _counted, _count
    act = activation.latest  # read, not called: once per request, in the busy step
    if act is None:
        return None, 0, False
    if act is not _counted:
        _counted, _count = act, 0
    _count += 1
    return act, _count, _count <= config.current.cold_requests
