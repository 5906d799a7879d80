"""One frozen config, read when the instrumentor runs (``_instrument``), never at import.

Hooks read :data:`current`; ``_instrument(tracer_provider=..., meter_provider=...)`` and the
``OTEL_*`` settings listed in ``environment_variables`` end up here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_ttft import environment_variables as env


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
            detail_ratio=min(1.0, max(0.0, _float(environ, env.OTEL_TTFT_REQUEST_DETAIL_RATIO,
                                                  env.DEFAULT_REQUEST_DETAIL_RATIO))),
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
        )


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value == value else default  # NaN reads as the default


current = Config()
"""The config in force; replaced as a whole by ``configure``."""


def configure(config: Config) -> None:
    global current
    current = config
