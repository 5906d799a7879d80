"""Every span name, attribute key, metric name and stage value otel-ttft emits, grouped by meaning:
``stages`` (the vocabulary and pipeline order), ``activation`` (start-up, wake, switch), ``load``
(checkpoint reads), ``parallel`` (the ranks of an engine's workers), ``request`` (the request
path), ``replay`` (the replay client) and ``telemetry`` (telemetry health). Import the package
(``from otel_ttft import semconv``): every name is here. To find where a stage is measured, grep
for its constant (e.g. ``STAGE_LOAD_READ``) under ``otel_ttft/runtime/hooks``. GenAI
semantic-convention names are used where they exist.
"""

from __future__ import annotations

from otel_ttft.semconv.activation import *  # noqa: F403
from otel_ttft.semconv.load import *  # noqa: F403
from otel_ttft.semconv.parallel import *  # noqa: F403
from otel_ttft.semconv.replay import *  # noqa: F403
from otel_ttft.semconv.request import *  # noqa: F403
from otel_ttft.semconv.stages import *  # noqa: F403
from otel_ttft.semconv.telemetry import *  # noqa: F403
