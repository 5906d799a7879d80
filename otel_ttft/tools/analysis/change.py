"""From a verdict to the concrete change (``otel_ttft.diagnosis.change``: the rules, shared with
the runtime's live verdict), attached to every verdict of an analysis document with the installed
vLLM's vocabulary read once (``knobs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_ttft.diagnosis.change import (
    FILL_CACHE,
    SIDE_CLIENT,
    SIDE_DRIVER,
    SIDE_SERVER,
    WARM_PREFIX,
    change_lines,
    describe,
    propose,
)
from otel_ttft.diagnosis.change_rules import RULES
from otel_ttft.tools.analysis import knobs

__all__ = ["FILL_CACHE", "SIDE_CLIENT", "SIDE_DRIVER", "SIDE_SERVER", "WARM_PREFIX", "attach",
           "change_lines", "describe", "propose"]


def attach(doc: dict, activations: Sequence[Any]) -> None:
    """Add ``change`` to every verdict of an analysis document (in place)."""
    verdicts = doc.get("verdicts") or []
    needs = any(v.get("recommendation") in RULES for v in verdicts)
    vocab, error = knobs.try_vocabulary() if needs else (None, None)
    by_scenario: dict[str, list[dict]] = {}
    for r in doc.get("requests") or []:
        by_scenario.setdefault(r["scenario"], []).append(r)
    for v in verdicts:
        v["change"] = propose(v, by_scenario.get(v["scenario"], []),
                              by_scenario.get(v["baseline"], []), doc.get("run") or {},
                              activations, vocab, error)
