"""vLLM 0.33's differences on the request path, tolerated by feature detection. They run on the
real 0.32 classes here; a shim adds only what 0.33 has and 0.32 lacks."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.hooks.request import worker
from otel_ttft.runtime.hooks.request.payload import CompileTime
from tests.request_engine import params, request_span

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


# --- WorkerProc.enqueue_output: vLLM resolves async outputs itself ------------------------------

class _Queue:
    def __init__(self):
        self.items = []

    def enqueue(self, item):
        self.items.append(item)


def _vllm_frame_on_stack() -> bool:
    return any(f.function == "enqueue_output" and "/vllm/" in f.filename
               for f in inspect.stack())


@pytest.fixture
def worker_proc():
    from vllm.v1.executor.multiproc_executor import WorkerProc

    hooks = HookSet([h for h in request.HOOKS if h.name == "request.warmup_ship"])
    hooks.apply()
    proc = WorkerProc.__new__(WorkerProc)  # its __init__ starts a worker; this method does not
    proc.worker_response_mq = _Queue()
    worker.pending.clear()
    yield proc
    hooks.remove()
    worker.pending.clear()


def _async_output(result):
    from vllm.v1.outputs import AsyncModelRunnerOutput

    class Output(AsyncModelRunnerOutput):
        """An async output; ``resolved_in_vllm`` says who resolved it."""

        resolved_in_vllm = None

        def get_output(self):
            Output.resolved_in_vllm = _vllm_frame_on_stack()
            if isinstance(result, Exception):
                raise result
            return result

        def get_kv_connector_output(self):  # 0.33's method: salvages KV output on failure
            return None

    return Output()


def _compiled() -> CompileTime:
    return CompileTime(1.0, 2.0, "logprobs.py:batched_count_greater_than", "2/0",
                       recompile=False, model_graph=False, step_tokens=6, step_requests=1)


def test_pending_warmup_rides_on_the_async_output_vllm_resolves(worker_proc):
    from vllm.v1.executor.multiproc_executor import WorkerProc
    from vllm.v1.outputs import ModelRunnerOutput

    worker.pending.append(_compiled())
    output = _async_output(ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0}))
    WorkerProc.enqueue_output(worker_proc, output)
    ((status, sent),) = worker_proc.worker_response_mq.items
    assert status == WorkerProc.ResponseStatus.SUCCESS
    assert getattr(sent, worker.WARMUP_ATTR) == [_compiled()]
    assert type(output).resolved_in_vllm is True
    assert worker.pending == []


def test_a_failed_async_output_is_vllms_to_report_and_the_times_wait(worker_proc):
    """0.33 turns this failure into FAILURE_WITH_KV_OUTPUT when KV output can be salvaged: that
    path exists only if vLLM, not our wrapper, calls ``get_output``."""
    from vllm.v1.executor.multiproc_executor import WorkerProc

    worker.pending.append(_compiled())
    output = _async_output(RuntimeError("device lost"))
    WorkerProc.enqueue_output(worker_proc, output)
    ((status, detail),) = worker_proc.worker_response_mq.items
    assert status == WorkerProc.ResponseStatus.FAILURE and "device lost" in detail
    assert type(output).resolved_in_vllm is True
    assert len(worker.pending) == 1  # shipped with the next output that gets through


# --- EngineCoreOutput.error (0.33): rejected on arrival ------------------------------------------

def _output_with_error():
    """0.33's ``EngineCoreOutput`` has an ``error`` field (``RequestError``); 0.32's has not."""
    from vllm.outputs import RequestError
    from vllm.v1.engine import EngineCoreOutput

    class EngineCoreOutput033(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):
        error: RequestError | None = None

    return EngineCoreOutput033, RequestError


def test_a_request_rejected_on_arrival_reads_as_rejected(engine, api_telemetry):
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import IterationStats

    exporter, _ = api_telemetry
    output_cls, request_error = _output_with_error()

    async def scenario():
        agen = engine.llm.generate("hello", params(8), "cmpl-rejected-1")
        first = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        out = output_cls(request_id="cmpl-rejected-1", new_token_ids=[],
                         finish_reason=FinishReason.ERROR,
                         error=request_error(code="engine_paused", message="paused"))
        engine.processor.process_outputs([out], 0.0, IterationStats())
        # 0.32 yields an output finished with "error"; 0.33 raises the error here.
        with contextlib.suppress(Exception):
            await first
        await agen.aclose()

    asyncio.run(scenario())
    span = request_span(exporter)
    assert span.attributes[semconv.ATTR_REQUEST_REJECTED] is True
    assert semconv.ATTR_REQUEST_TTFT not in span.attributes
    assert span.status.status_code.name == "ERROR" and "engine_paused" in span.status.description
    assert [s for s in exporter.get_finished_spans() if s.parent is not None
            and s.parent.span_id == span.context.span_id] == [], "nothing ran: no stages"


def test_the_shim_is_needed_only_on_032():
    from vllm.v1.engine import EngineCoreOutput

    has_error = "error" in EngineCoreOutput.__struct_fields__
    assert has_error == (sys.modules["vllm"].__version__ >= "0.33")
