"""vLLM 0.33's differences on the request path, tolerated by feature detection. They run on the
real 0.32 classes here; a shim adds only what 0.33 has and 0.32 lacks."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.hooks import request
from otel_ttft.runtime.hooks.request.payload import WORKER_NOTES_ATTR, CompileTime
from tests.request_engine import params, request_span

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


# --- async scheduling: the output vLLM resolves carries the worker's notes ----------------------

class _Event:
    def __init__(self, error):
        self.error = error

    def synchronize(self):
        if self.error is not None:
            raise self.error


@pytest.fixture
def async_output(hooks):
    """vLLM's real ``AsyncGPUModelRunnerOutput`` (its copy to the host already done: built
    bare, the tensors in place), its ``get_output`` hooked; returns (make, the worker part)."""
    import torch
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    part = hooks(*[h for h in request.HOOKS if h.name == "request.step_output_v1"]
                 ).part("request.worker")

    def make(error=None):
        out = object.__new__(AsyncGPUModelRunnerOutput)
        out._model_runner_output = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})
        out._invalid_req_indices, out.vocab_size = [], 32
        out.async_copy_ready_event = _Event(error)
        out._sampled_token_ids = out.sampled_token_ids_cpu = torch.tensor([[5]])
        out._logprobs_tensors = out._logprobs_tensors_cpu = None
        out._num_nans = out._num_nans_cpu = out._has_fault = None
        return out

    return make, part


def _compiled() -> CompileTime:
    return CompileTime(1.0, 2.0, "logprobs.py:batched_count_greater_than", "2/0",
                       recompile=False, model_graph=False, step_tokens=6, step_requests=1)


def test_pending_warmup_rides_on_the_async_output_vllm_resolves(async_output):
    make, part = async_output
    part.keep(_compiled())
    resolved = make().get_output()
    assert resolved.sampled_token_ids == [[5]]  # vLLM's own resolution, unchanged
    handed = getattr(resolved, WORKER_NOTES_ATTR)
    assert handed.notes == [_compiled()] and handed.steps == []
    assert part.notes == []
    again = make().get_output()  # nothing pending: nothing handed
    assert getattr(again, WORKER_NOTES_ATTR, None) is None


def test_a_failed_async_output_is_vllms_to_report_and_the_times_wait(async_output):
    """0.33 turns this failure into FAILURE_WITH_KV_OUTPUT when KV output can be salvaged: vLLM
    sees its own exception, unchanged."""
    make, part = async_output
    part.keep(_compiled())
    with pytest.raises(RuntimeError, match="device lost"):
        make(RuntimeError("device lost")).get_output()
    assert part.notes == [_compiled()]  # shipped with the next output that gets through


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
