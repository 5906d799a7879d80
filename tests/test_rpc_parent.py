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
