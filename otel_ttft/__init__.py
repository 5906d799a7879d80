"""otel-ttft: why the first token was slow, as spans and metrics from every vLLM process."""

from otel_ttft.version import __version__

__all__ = ["__version__"]
