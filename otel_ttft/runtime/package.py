"""What otel-ttft instruments: either distribution of vLLM (see pyproject's instruments-any)."""

from otel_ttft.runtime.vllm_version import SUPPORTED, VLLM_DISTRIBUTIONS

_instruments_any = tuple(f"{dist} {SUPPORTED}" for dist in VLLM_DISTRIBUTIONS)
_supports_metrics = True
