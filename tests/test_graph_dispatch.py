"""The first prefill step's CUDA-graph decision, in every cudagraph mode, on vLLM's real
dispatchers (issue 55): V2's ``CudaGraphManager`` built by its own constructor and after its own
``capture`` (tests/cudagraph_plants.py stands in the GPU), V1's ``CudagraphDispatcher`` with its
own keys. What ran is vLLM's per-step ``CUDAGraphStat`` where the step's output carries one."""

from __future__ import annotations

import pytest
import torch

from otel_ttft import semconv
from otel_ttft.runtime.hooks.request import attributes, payload
from tests.cudagraph_plants import MAX_SEQS, config_for, manager_class, pieces, stand_in_cuda

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def no_cuda(monkeypatch):
    return stand_in_cuda(monkeypatch)


def _step(tokens, ids=("a", "b")):
    """A step that starts requests ``ids`` with ``tokens`` (vLLM's real ``SchedulerOutput``)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    step = SchedulerOutput.make_empty()
    step.scheduled_new_reqs = [type("New", (), {"req_id": rid})() for rid in ids]
    step.total_num_scheduled_tokens = tokens
    return step


def _part(hooks, name, step):
    from otel_ttft.runtime.hooks import request

    part = hooks(*[h for h in request.HOOKS if h.name == name]).part("request.worker")
    part.last_step = step
    return part


def _shipped(part, stats=None):
    """What the step's output (vLLM's real ``ModelRunnerOutput``) carries to EngineCore."""
    from vllm.v1.outputs import ModelRunnerOutput

    output = part.attach(ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                           cudagraph_stats=stats))
    notes = getattr(output, payload.WORKER_NOTES_ATTR, None)
    return [n.choice for n in notes.notes] if notes is not None else []


def _captured_manager(cu, mode):
    manager = manager_class(cu)(config_for(mode), torch.device("cpu"), mode, decode_query_len=1)
    config = manager.vllm_config
    manager.capture(pieces(config), None, torch.zeros(64))
    return manager


def _modes():
    from vllm.config.compilation import CUDAGraphMode

    # mode, (mode, padded) for 20 tokens, largest mixed graph, largest full, largest piecewise
    return {"piecewise-only": (CUDAGraphMode.PIECEWISE, ("PIECEWISE", 32), 64, 0, 64),
            "full-only": (CUDAGraphMode.FULL, ("FULL", 32), 64, 64, 0),
            "full-and-piecewise": (CUDAGraphMode.FULL_AND_PIECEWISE, ("PIECEWISE", 32), 64,
                                   MAX_SEQS, 64)}


@pytest.mark.parametrize("name", ["piecewise-only", "full-only", "full-and-piecewise"])
def test_v2_first_prefill_decision_in_every_mode(hooks, no_cuda, name):
    mode, (ran, padded), mixed, full, piecewise = _modes()[name]
    manager = _captured_manager(no_cuda, mode)
    part = _part(hooks, "request.graph_dispatch_v2", _step(20))
    assert manager.dispatch(2, 20, None, 0).cg_mode.name == ran  # vLLM's answer, unchanged
    manager.dispatch(2, 2, None, 0)  # the logits-only dispatch of a KV-sharing model: not it
    (choice,) = _shipped(part)
    assert (choice.mode, choice.tokens, choice.padded) == (ran, 20, padded)
    assert (choice.max_captured, choice.max_full, choice.max_piecewise) == (mixed, full, piecewise)
    assert choice.compiled and choice.source == "dispatch"
    evidence = attributes.graph_evidence(choice)
    assert evidence[semconv.ATTR_STEP_EXECUTION] == f"{ran.lower()}_graph"

    part.last_step = _step(100)  # more tokens than any graph: the compiled model, not eager
    assert manager.dispatch(2, 100, None, 0).cg_mode.name == "NONE"
    (choice,) = _shipped(part)
    assert (choice.mode, choice.padded, choice.max_captured) == ("NONE", 100, mixed)
    assert attributes.graph_evidence(choice)[semconv.ATTR_STEP_EXECUTION] == "compiled"
    assert attributes.step_execution(
        payload.GraphChoice("NONE", 100, mixed, compiled=False)) == "eager"


def test_what_ran_is_vllms_own_record_of_the_step(hooks, no_cuda):
    """Data-parallel ranks may agree on another mode than this rank's dispatch: vLLM's
    ``CUDAGraphStat`` for the step (``--cudagraph-metrics``) is what ran."""
    from vllm.compilation.cuda_graph import CUDAGraphStat
    from vllm.config.compilation import CUDAGraphMode

    manager = _captured_manager(no_cuda, CUDAGraphMode.FULL_AND_PIECEWISE)
    part = _part(hooks, "request.graph_dispatch_v2", _step(20))
    manager.dispatch(2, 20, None, 0)
    stats = CUDAGraphStat(num_unpadded_tokens=20, num_padded_tokens=20, num_paddings=0,
                          runtime_mode=str(CUDAGraphMode.NONE))
    (choice,) = _shipped(part, stats)
    assert (choice.mode, choice.padded, choice.source) == ("NONE", 20, "cudagraph_stats")
    assert choice.tokens == 20 and choice.max_captured == 64


def test_v2_eager_server_notes_nothing(hooks, no_cuda):
    from vllm.config.compilation import CUDAGraphMode

    manager = manager_class(no_cuda)(config_for(CUDAGraphMode.NONE), torch.device("cpu"),
                                     CUDAGraphMode.NONE, decode_query_len=1)
    part = _part(hooks, "request.graph_dispatch_v2", _step(20))
    manager.dispatch(2, 20, None, 0)
    assert _shipped(part) == []


def _v1_dispatcher(mode):
    """V1's real dispatcher, built before the mode is set (its constructor checks piecewise
    compilation against the config, which on CPU has no graphs), then its keys for ``mode``."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    config = config_for(CUDAGraphMode.NONE)
    dispatcher = CudagraphDispatcher(config)
    config_mode = config_for(mode).compilation_config
    cc = config.compilation_config
    cc.cudagraph_capture_sizes = config_mode.cudagraph_capture_sizes
    cc.max_cudagraph_capture_size = config_mode.max_cudagraph_capture_size
    dispatcher.initialize_cudagraph_keys(mode, 1)
    return dispatcher


@pytest.mark.parametrize("name", ["piecewise-only", "full-only", "full-and-piecewise"])
def test_v1_first_prefill_decision_in_every_mode(hooks, name):
    mode, (ran, padded), mixed, full, piecewise = _modes()[name]
    dispatcher = _v1_dispatcher(mode)
    part = _part(hooks, "request.graph_dispatch", _step(20))
    dispatcher.dispatch(2)  # V1's logits-only dispatch (KV sharing) comes first: not the step's
    assert dispatcher.dispatch(20)[0].name == ran
    (choice,) = _shipped(part)
    assert (choice.mode, choice.tokens, choice.padded) == (ran, 20, padded)
    assert (choice.max_captured, choice.max_full, choice.max_piecewise) == (mixed, full, piecewise)


def test_v1_redispatch_after_data_parallel_agreement_replaces_the_first(hooks):
    from vllm.config.compilation import CUDAGraphMode

    dispatcher = _v1_dispatcher(CUDAGraphMode.FULL_AND_PIECEWISE)
    part = _part(hooks, "request.graph_dispatch", _step(20))
    dispatcher.dispatch(20)
    dispatcher.dispatch(64, valid_modes={CUDAGraphMode.PIECEWISE})  # another rank's size
    (choice,) = _shipped(part)
    assert (choice.mode, choice.tokens, choice.padded) == ("PIECEWISE", 20, 64)
