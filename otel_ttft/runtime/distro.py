"""Makes ``opentelemetry-instrument`` export over OTLP with no other package installed.

Without a distro and configurator the SDK installs no provider, and vLLM's spans and ours would go
nowhere. Defaults only: every ``OTEL_*`` variable the user sets wins, and another installed distro
(``OTEL_PYTHON_DISTRO``/``OTEL_PYTHON_CONFIGURATOR``) can be chosen instead.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro

from otel_ttft.runtime import configurator


class OtelTTFTDistro(BaseDistro):
    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault("OTEL_TRACES_EXPORTER", "otlp")
        os.environ.setdefault("OTEL_METRICS_EXPORTER", "otlp")
        os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
        os.environ.setdefault("OTEL_SERVICE_NAME", "vllm")


class OtelTTFTConfigurator:
    """The ``opentelemetry_configurator`` entry point: ``opentelemetry-instrument`` calls
    ``configure()`` once per process; the providers and exporters come from the ``OTEL_*``
    settings, with a bounded exit (``runtime.configurator``). What the SDK's configurator base
    class would add (a singleton) is this lock and flag; no SDK-private name is needed."""

    _lock = threading.Lock()
    _done = False

    def configure(self, **kwargs: Any) -> None:
        with OtelTTFTConfigurator._lock:
            if OtelTTFTConfigurator._done:
                return
            OtelTTFTConfigurator._done = True
        configurator.configure()
