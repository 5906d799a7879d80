"""Worker spans triggered over collective_rpc nest under the EngineCore span that asked for them.

The real vLLM dispatch is used: the method travels through cloudpickle exactly as
MultiprocExecutor.collective_rpc sends it, and vLLM's own run_method calls it on the worker.
"""

from __future__ import annotations

import cloudpickle
import pytest
from opentelemetry import trace

from otel_ttft.runtime.hooks import rpc
from tests.otel_memory import memory_exporter

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


class FakeWorker:
    def determine_available_memory(self, scale=1):
        with trace.get_tracer("test").start_as_current_span("Profile run"):
            return 42 * scale


def test_traced_call_runs_under_the_callers_span_after_pickling():
    from vllm.v1.serial_utils import run_method

    exporter = memory_exporter()
    exporter.clear()
    sent = {}

    def fake_collective_rpc(method, timeout=None, args=(), kwargs=None):
        sent["wire"] = cloudpickle.dumps(method) if not isinstance(method, str) else method
        return None

    with trace.get_tracer("test").start_as_current_span("Prepare model") as caller:
        rpc._wrap_collective_rpc(fake_collective_rpc, None, ("determine_available_memory",),
                                 {"args": (2,)})
    wire = sent["wire"]
    assert isinstance(wire, bytes), "start-up RPCs must carry the caller's context"
    # Worker side, as vLLM's WorkerProc does it: unpickle, then call with the worker.
    assert run_method(FakeWorker(), wire, (2,), {}) == 84
    profile = next(s for s in exporter.get_finished_spans() if s.name == "Profile run")
    assert profile.parent.span_id == caller.get_span_context().span_id
    assert profile.context.trace_id == caller.get_span_context().trace_id


def test_hot_path_methods_are_sent_untouched():
    sent = {}

    def fake(method, *a, **k):
        sent["method"] = method

    with trace.get_tracer("test").start_as_current_span("step"):
        rpc._wrap_collective_rpc(fake, None, ("execute_model",), {})
    assert sent["method"] == "execute_model"


def test_without_a_current_span_nothing_changes():
    sent = {}

    def fake(method, *a, **k):
        sent["method"] = method

    rpc._wrap_collective_rpc(fake, None, ("determine_available_memory",), {})
    assert sent["method"] == "determine_available_memory"


class _Executor:
    """vLLM's own ``execute_model``/``sample_tokens`` (``MultiprocExecutor``) and
    ``sleep``/``wake_up`` (``Executor``) over a ``collective_rpc`` that records what it is sent
    instead of broadcasting it to worker processes."""

    def __init__(self):
        self.sent: list = []
        self.output_rank = 0
        self.kv_output_aggregator = self.ec_output_aggregator = None
        self.sleeping_tags: set[str] = set()

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, **options):
        self.sent.append(method)


@pytest.fixture
def executor_hooks():
    from dataclasses import replace

    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from otel_ttft.runtime.hooks.registry import HookSet

    for name in ("execute_model", "sample_tokens"):
        setattr(_Executor, name, vars(MultiprocExecutor)[name])
    for name in ("sleep", "wake_up", "is_sleeping"):
        setattr(_Executor, name, vars(Executor)[name])
    targets = {"rpc.parent_context": "collective_rpc"}
    hooks = HookSet([replace(h, target=f"{__name__}:_Executor.{targets[h.name]}", applied=False)
                     for h in rpc.HOOKS if h.name in targets])
    hooks.apply()
    yield
    hooks.remove()


def test_per_step_rpcs_go_as_they_came_and_sleep_carries_its_parent(executor_hooks):
    executor = _Executor()
    with trace.get_tracer("test").start_as_current_span("Engine step"):
        executor.execute_model(None)
    executor.sample_tokens(None)
    with trace.get_tracer("test").start_as_current_span("Sleep"):
        executor.sleep(level=1)  # vLLM's Executor.sleep: its RPC through our wrapper
    *steps, sleep = executor.sent
    assert steps == ["execute_model", "sample_tokens"]
    assert isinstance(sleep, rpc.TracedCall) and sleep.method == "sleep"
    with trace.get_tracer("test").start_as_current_span("Wake up"):
        executor.wake_up()
    assert isinstance(executor.sent[-1], rpc.TracedCall)
