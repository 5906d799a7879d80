"""Shared fixtures: an OTLP receiver on a temporary store, the tiny model, and the `vllm` marker
skip rule (tests that need a real vLLM are skipped, with the reason, where it cannot import)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ttft import environment_variables as env
from otel_ttft import semconv
from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import SpanStore

# Hook tests look at every request's span and stage children; the default policy (a span, with
# children, only for cold, slow, tail, failed, sampled and caller-traced requests) has its own
# tests (test_request_detail), and the verdict and replay tests run on it (what users get).
os.environ.setdefault(env.OTEL_TTFT_REQUEST_DETAIL, semconv.DETAIL_ALL)


@functools.cache
def _vllm_import_error() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # any failure (missing, broken torch build) means: cannot run
        return f"{type(exc).__name__}: {exc}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("vllm")]
    if not marked:
        return
    error = _vllm_import_error()
    if error is None or os.environ.get("CI"):
        return  # in CI a missing vLLM is an install bug: let those tests fail, never skip
    skip = pytest.mark.skip(reason=f"needs a real vLLM; `import vllm` failed: {error}")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OTLPReceiver]:
    """OTLP/HTTP + gRPC receiver on free loopback ports, storing under ``tmp_path/store``."""
    rx = OTLPReceiver(SpanStore(tmp_path / "store"))
    rx.start()
    try:
        yield rx
    finally:
        rx.stop()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Directory of the tiny local Llama checkpoint (built once, cached)."""
    from otel_ttft.tiny_model import ensure_tiny_model

    return ensure_tiny_model()
