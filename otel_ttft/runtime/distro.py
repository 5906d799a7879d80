"""Makes ``opentelemetry-instrument`` export over OTLP with no other package installed.

Without a distro and configurator the SDK installs no provider, and vLLM's spans and ours would go
nowhere. Defaults only: every ``OTEL_*`` variable the user sets wins, and another installed distro
(``OTEL_PYTHON_DISTRO``/``OTEL_PYTHON_CONFIGURATOR``) can be chosen instead.

All three (the defaults, the providers, our instrumentor) happen in vLLM's processes only
(``runtime.gate``): ``opentelemetry-instrument`` also runs in every helper a server starts
(multiprocessing's resource tracker, compile workers, probes), and there this module and the gate
are all of ours that load. Where the command line does not say, they wait for ``import vllm``.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro

from otel_ttft.runtime import gate

_OURS = "otel_ttft."  # our entry points' values start so
NAME = "otel_ttft"  # the name our distro and configurator are registered under
#: The one setting that makes ``opentelemetry-instrument`` run our configurator whatever else is
#: installed (``opentelemetry-distro`` registers one named ``configurator``).
RESTORE = f"OTEL_PYTHON_CONFIGURATOR={NAME}"


def configurators() -> list[tuple[str, str]]:
    """Every ``opentelemetry_configurator`` entry point as ``(name, distribution)``, in the order
    ``opentelemetry-instrument`` finds them: distributions in ``sys.path`` order, and within one
    directory in the order the file system lists them (no order a user can rely on)."""
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group="opentelemetry_configurator"):
        dist = getattr(ep, "dist", None)
        found.append((ep.name, getattr(dist, "name", None) or "?"))
    return found


def configurator_in_force(environ: Any = None) -> str | None:
    """The configurator ``opentelemetry-instrument`` runs (its ``_load_configurators``): the one
    ``OTEL_PYTHON_CONFIGURATOR`` names, else the first found; ``None`` where the setting names
    none that is installed (``sdk`` is not a name any package registers)."""
    environ = os.environ if environ is None else environ
    chosen = (environ.get("OTEL_PYTHON_CONFIGURATOR") or "").strip() or None
    return next((name for name, _ in configurators() if chosen is None or name == chosen), None)


def ours_configured() -> bool:
    """Whether ``opentelemetry-instrument`` called our configurator in this process."""
    return OtelTTFTConfigurator._done


def _defaults() -> None:
    os.environ.setdefault("OTEL_TRACES_EXPORTER", "otlp")
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "otlp")
    os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
    os.environ.setdefault("OTEL_SERVICE_NAME", "vllm")


def _configure_providers() -> None:
    from otel_ttft.runtime import configurator  # the SDK: only in vLLM's processes

    configurator.configure()


class OtelTTFTDistro(BaseDistro):
    def _configure(self, **kwargs: Any) -> None:
        gate.when_vllm(_defaults, "OTEL_* defaults")

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        """Our instrumentor in vLLM's processes only (``runtime.gate``); any other as the
        base distro loads it."""
        load = functools.partial(BaseDistro.load_instrumentor, self, entry_point, **kwargs)
        if getattr(entry_point, "value", "").startswith(_OURS):
            gate.when_vllm(load, f"instrumentor {entry_point.name}")
        else:
            load()


class OtelTTFTConfigurator:
    """The ``opentelemetry_configurator`` entry point: ``opentelemetry-instrument`` calls
    ``configure()`` once per process; the providers and exporters come from the ``OTEL_*``
    settings, with a bounded exit (``runtime.configurator``), in vLLM's processes only
    (``runtime.gate``). What the SDK's configurator base class would add (a singleton) is this
    lock and flag; no SDK-private name is needed."""

    _lock = threading.Lock()
    _done = False

    def configure(self, **kwargs: Any) -> None:
        with OtelTTFTConfigurator._lock:
            if OtelTTFTConfigurator._done:
                return
            OtelTTFTConfigurator._done = True
        gate.when_vllm(_configure_providers, "the OpenTelemetry SDK's providers")
