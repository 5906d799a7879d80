"""Which activation a request may have paid for: the first ``cold_requests`` requests after an
activation (start, wake-up, switch) in this process count as cold."""

from __future__ import annotations

from typing import Any

from otel_ttft.runtime import config
from otel_ttft.runtime.hooks import activation

_counted: Any = None  # the activation being counted (each is a new object)
_count = 0


def note_activation(rec: Any) -> None:
    """Sets ``rec.activation``, ``rec.cold_index`` and ``rec.cold`` from the latest activation."""
    global _counted, _count
    act = activation.latest  # read, not called: once per request, in the busy step
    if act is None:
        return
    if act is not _counted:
        _counted, _count = act, 0
    _count += 1
    rec.activation = act
    rec.cold_index = _count
    rec.cold = _count <= config.current.cold_requests
