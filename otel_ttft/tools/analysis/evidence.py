"""What a verdict shows beside its stage: ``otel_ttft.diagnosis.evidence``, shared with the
runtime's live verdict."""

from __future__ import annotations

from otel_ttft.diagnosis.evidence import *  # noqa: F403
from otel_ttft.diagnosis.evidence import __all__  # noqa: F401
