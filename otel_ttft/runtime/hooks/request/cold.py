"""Which activation a request may have paid for: the first ``cold_requests`` requests after an
activation (start, wake-up, switch) in this process count as cold."""

from __future__ import annotations

from typing import Any


class ColdCounter:
    """The activation being counted (each is a new object) and the requests since."""

    __slots__ = ("limit", "activations", "counted", "count_since")

    def __init__(self, cold_requests: int, activations: Any) -> None:
        self.limit = cold_requests
        self.activations = activations  # the activation part: its ``latest``
        self.counted: Any = None
        self.count_since = 0

    def count(self) -> tuple[Any, int, bool]:
        """A request arrived: the latest activation (``None`` before the first), the request's
        position among the requests since (1 = first; 0 without one) and whether that makes it
        cold. Called once for every request, record or not."""
        act = self.activations.latest  # read, not called: once per request, in the busy step
        if act is None:
            return None, 0, False
        if act is not self.counted:
            self.counted, self.count_since = act, 0
        self.count_since += 1
        return act, self.count_since, self.count_since <= self.limit
