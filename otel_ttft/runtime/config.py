"""One frozen config, read when the instrumentor runs (``_instrument``), never at import.

``_instrument(tracer_provider=..., meter_provider=...)`` and the ``OTEL_*`` settings listed in
``environment_variables`` end up here, on the process's state (``ProcessState.config``), which
each part keeps what it needs of. ``tracer_provider()`` and
``meter_provider()`` say which providers everything we create uses: the ones given to
``instrument()``, else the global ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace

from otel_ttft.runtime import environment_variables as env

logger = logging.getLogger("otel_ttft")


@dataclass(frozen=True, slots=True)
class Config:
    """What the hooks need to know about the user's choices."""

    capture_content: bool = False
    """Record prompt and output text on request spans (opt-in)."""
    cold_requests: int = env.DEFAULT_COLD_REQUESTS
    """Requests after an activation that count as cold."""
    disabled_hooks: frozenset[str] = frozenset()
    """Hook names left unwrapped."""
    request_detail: str = "auto"
    """Which requests get a span and stage children: auto | spans | all | none
    (``hooks.request.detail``)."""
    detail_slow_s: float = env.DEFAULT_REQUEST_DETAIL_SLOW_MS / 1000
    """``auto``: TTFT above this gets children."""
    detail_ratio: float = env.DEFAULT_REQUEST_DETAIL_RATIO
    """``auto``: the sampled share of the rest."""
    exit_timeout_s: float = env.DEFAULT_EXIT_TIMEOUT_MS / 1000
    """Deadline of the final flush at exit (``bounded_export``)."""
    snapshot_after_s: float = env.DEFAULT_SNAPSHOT_AFTER_S
    """Snapshot an activation span open this long; 0: never (``inflight``)."""
    tracer_provider: Any = None
    """The provider passed to ``instrument()``; ``None``: the global one."""
    meter_provider: Any = None
    """The provider passed to ``instrument()``; ``None``: the global one."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Config:
        """Settings from the environment; ``kwargs`` (providers) as given to ``instrument()``."""
        environ = os.environ if environ is None else environ
        raw_cold = environ.get(env.OTEL_TTFT_COLD_REQUESTS, "")
        try:
            cold = max(0, int(raw_cold)) if raw_cold.strip() else env.DEFAULT_COLD_REQUESTS
        except ValueError:
            cold = env.DEFAULT_COLD_REQUESTS
        disabled = environ.get(env.OTEL_TTFT_DISABLED_HOOKS, "")
        detail = environ.get(env.OTEL_TTFT_REQUEST_DETAIL, "").strip().lower() or "auto"
        return cls(
            capture_content=environ.get(
                env.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, "").strip().lower()
            == "true",
            cold_requests=cold,
            disabled_hooks=frozenset(n.strip() for n in disabled.split(",") if n.strip()),
            request_detail=detail if detail in ("auto", "spans", "all", "none") else "auto",
            detail_slow_s=_float(environ, env.OTEL_TTFT_REQUEST_DETAIL_SLOW_MS,
                                 env.DEFAULT_REQUEST_DETAIL_SLOW_MS) / 1000,
            detail_ratio=_float(environ, env.OTEL_TTFT_REQUEST_DETAIL_RATIO,
                                env.DEFAULT_REQUEST_DETAIL_RATIO, low=0.0, high=1.0),
            exit_timeout_s=_float(environ, env.OTEL_TTFT_EXIT_TIMEOUT_MS,
                                  env.DEFAULT_EXIT_TIMEOUT_MS, low=0.0, high=_MAX_EXIT_MS) / 1000,
            snapshot_after_s=_float(environ, env.OTEL_TTFT_SNAPSHOT_AFTER_S,
                                    env.DEFAULT_SNAPSHOT_AFTER_S, low=0.0),
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
        )


_MAX_EXIT_MS = 3_600_000.0  # an hour: "inf" must not reach Thread.join (OverflowError at exit)


def _float(environ: Mapping[str, str], name: str, default: float, *,
           low: float | None = None, high: float | None = None) -> float:
    """A number from the environment: unset or blank reads as ``default``; so does anything that
    is not a number (NaN included), with a warning; then clamped to ``[low, high]``."""
    raw = environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value != value:
        logger.warning("otel-ttft: %s=%r is not a number; using %s", name, raw, default)
        return default
    if low is not None:
        value = max(value, low)
    return value if high is None else min(value, high)


def tracer_provider(cfg: Config) -> Any:
    """The tracer provider our spans, processors and flushes use: the one given to
    ``instrument()`` (``cfg``'s), else the global one (a proxy
    until someone installs one)."""
    provider = cfg.tracer_provider
    return provider if provider is not None else trace.get_tracer_provider()


def meter_provider(cfg: Config) -> Any:
    """The meter provider our instruments use: the one given to ``instrument()``, else the
    global one."""
    provider = cfg.meter_provider
    return provider if provider is not None else metrics.get_meter_provider()


def tracing_ready(cfg: Config) -> bool:
    """A tracer provider exists: one was given to ``instrument()`` or installed globally
    (opentelemetry-instrument, vLLM); until then our spans would go nowhere."""
    return (cfg.tracer_provider is not None
            or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider))


def metrics_ready(cfg: Config) -> bool:
    """A meter provider exists: given to ``instrument()``, or an SDK one installed globally (the
    API's proxy and no-op providers cannot flush)."""
    return cfg.meter_provider is not None or hasattr(metrics.get_meter_provider(),
                                                                  "force_flush")
