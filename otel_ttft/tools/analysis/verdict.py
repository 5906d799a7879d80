"""The verdict rule, as ``analyze`` and ``verify`` name it: it lives in ``otel_ttft.diagnosis.rule``
so that the runtime's live verdict on each activation applies the very same rule."""

from __future__ import annotations

from otel_ttft.diagnosis.rule import *  # noqa: F403
from otel_ttft.diagnosis.rule import __all__  # noqa: F401
