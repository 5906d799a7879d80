"""Makes ``opentelemetry-instrument`` export over OTLP with no other package installed.

Without a distro and configurator the SDK installs no provider, and vLLM's spans and ours would go
nowhere. Defaults only: every ``OTEL_*`` variable the user sets wins, and another installed distro
(``OTEL_PYTHON_DISTRO``/``OTEL_PYTHON_CONFIGURATOR``) can be chosen instead.
"""

from __future__ import annotations

import os

from opentelemetry.instrumentation.distro import BaseDistro

from otel_ttft.runtime.telemetry import sdk_internals


class OtelTTFTDistro(BaseDistro):
    def _configure(self, **kwargs) -> None:
        os.environ.setdefault("OTEL_TRACES_EXPORTER", "otlp")
        os.environ.setdefault("OTEL_METRICS_EXPORTER", "otlp")
        os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
        os.environ.setdefault("OTEL_SERVICE_NAME", "vllm")


class OtelTTFTConfigurator(sdk_internals.sdk_configurator()):  # type: ignore[misc]
    """The SDK's own configurator: providers and exporters from the ``OTEL_*`` settings."""
