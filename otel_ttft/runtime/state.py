"""What otel-ttft keeps in one vLLM process: one :class:`ProcessState`, built by ``_instrument``
with the config and providers, handed to every wrapper that needs it, closed by
``_uninstrument``.

It is made of parts, one per hook family that keeps anything (``hooks.all_parts``): the request
book of the API server, EngineCore's per-request counts, a worker's pending notes, the activation
being built, the switch's signal handlers... A hook names the part it is given
(``Hook.state``); a part belongs to the module that defines its class, and no other module reads
or writes it. Closing the state closes every part in the reverse order of their making: spans
ended, descriptors closed, callbacks, gauges, exit handlers and filters taken back.

Beside the parts, the state holds the process's :class:`ProcessIdentity` (which vLLM process this
is, which model it serves): set by the activation hooks as the process starts, through the part
they are handed, and given to every part that tags spans or metrics with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import metrics, trace

from otel_ttft import semconv
from otel_ttft.runtime.config import Config
from otel_ttft.version import __version__

logger = logging.getLogger("otel_ttft")


class Part(Protocol):
    """A family's state; ``close`` (optional) undoes whatever it installed."""


@dataclass(frozen=True)
class PartSpec:
    """How a hook family makes its part: ``name`` (what ``Hook.state`` says) and ``make``,
    given the process state being built (its config and the parts made before)."""

    name: str
    make: Callable[[ProcessState], Any]


@dataclass
class ProcessIdentity:
    """Which vLLM process this is: ``kind``, one of ``semconv.PROCESS_KINDS`` once known, and
    ``served_model``, the name vLLM serves (``--served-model-name``, else the model path). Blank
    until the activation hooks learn them (their part writes it; everything else reads it)."""

    kind: str | None = None
    served_model: str | None = None

    def set_kind(self, kind: str) -> None:
        if kind not in semconv.PROCESS_KINDS:
            raise ValueError(f"unknown process kind {kind!r}")
        self.kind = kind


class ProcessState:
    """Everything this process's instrumentation holds, in one place."""

    def __init__(self, config: Config, specs: list[PartSpec] | tuple[PartSpec, ...] = ()):
        self.config = config
        self.identity = ProcessIdentity()
        # the providers given to ``instrument()``, else the global ones (proxies until installed)
        self.tracer = trace.get_tracer("otel_ttft", __version__,
                                       tracer_provider=config.tracer_provider)
        self.meter = metrics.get_meter("otel_ttft", __version__,
                                       meter_provider=config.meter_provider)
        self.parts: dict[str, Any] = {}
        for spec in specs:
            if spec.name in self.parts:
                raise ValueError(f"two state parts named {spec.name!r}")
            self.parts[spec.name] = spec.make(self)

    def part(self, name: str) -> Any:
        """The part named ``name`` (a ``KeyError`` is a hook naming a part nobody makes)."""
        return self.parts[name]

    def close(self) -> None:
        """Close every part, newest first; one part's failure does not keep the rest open."""
        for name, part in reversed(list(self.parts.items())):
            close = getattr(part, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:  # noqa: BLE001 - uninstrument must finish
                logger.warning("otel-ttft: closing state %s failed", name, exc_info=True)
        self.parts.clear()
