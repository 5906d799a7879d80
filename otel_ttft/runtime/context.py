"""Which vLLM process this is and which model it serves.

Set once by the activation hooks as the process starts (the plugin loads before anything of ours
emits), read by spans, metrics and the in-flight tracker. A leaf: it imports nothing of ours, so
every runtime module may read it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_ttft import semconv


@dataclass
class ProcessContext:
    """``kind``: one of ``semconv.PROCESS_KINDS`` once known; ``served_model``: the name vLLM
    serves (``--served-model-name``, else the model path)."""

    kind: str | None = None
    served_model: str | None = None

    def set_kind(self, kind: str) -> None:
        if kind not in semconv.PROCESS_KINDS:
            raise ValueError(f"unknown process kind {kind!r}")
        self.kind = kind


process = ProcessContext()
