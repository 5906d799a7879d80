"""A Triton kernel compiled inside a step is first-use warm-up (issue 55): Triton's real
compiler (source to PTX to cubin, with the ``ptxas`` its wheel ships) behind Triton's public
hooks, on this CPU machine. Only the device Triton asks which architecture to compile for is
stood in (``driver.set_active``: an sm_80 target); nothing is launched. vLLM's CPU build turns
its own Triton use off, so vLLM's kernels cannot be compiled here: the kernel is ours, shaped
like V2's logprobs kernel; on a GPU, scripts/gpu-check part 5 asks for V2's own."""

from __future__ import annotations

import pytest
import torch

from otel_ttft.runtime.hooks.request import payload, spans, worker

triton = pytest.importorskip("triton", reason="Triton is not installed")


class _Sm80:
    """The device Triton compiles for: an A100's architecture. Asked, never launched on."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 80, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


@pytest.fixture
def sm80(monkeypatch, tmp_path):
    from triton.runtime import driver

    monkeypatch.setattr(driver, "_active", _Sm80())  # what driver.set_active sets
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a real compile, not a disk hit
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")


def _compile(block):
    from tests.triton_kernels import log_softmax_row

    logits = torch.zeros(block)
    log_softmax_row.warmup(torch.empty_like(logits), logits, block, BLOCK_SIZE=block, grid=(1,))


@pytest.fixture
def in_step():
    """A worker part whose first step (``Worker.execute_model``, our wrapper) runs ``work``."""
    from vllm.v1.core.sched.output import SchedulerOutput

    part = worker.WorkerSteps()
    step = SchedulerOutput.make_empty()
    step.total_num_scheduled_tokens = 6
    step.num_scheduled_tokens = {"a": 6}

    def run(work):
        worker.wrap_execute_model(part, lambda s: work(), type("W", (), {"device": None})(),
                                  (step,), {})
        taken = [n for n in part.notes if isinstance(n, payload.CompileTime)]
        part.notes.clear()
        return taken

    yield part, run
    part.close()


@pytest.mark.vllm_import
def test_a_triton_compile_inside_a_step_is_noted_and_named(sm80, in_step):
    from triton import knobs

    part, run = in_step
    monitor_saw = []  # a hook installed before ours (vLLM's JIT monitor chains the same way)
    knobs.runtime.jit_post_compile_hook = lambda **kw: monitor_saw.append(kw["fn"].name)
    try:
        (first,) = run(lambda: _compile(128))
        assert (first.compiler, first.frame) == ("triton", "triton_kernels.py:log_softmax_row")
        assert (first.recompile, first.model_graph) == (False, False)
        assert (first.step_tokens, first.step_requests) == (6, 1)
        assert first.end > first.start
        assert monitor_saw == ["log_softmax_row"]  # the hook before ours still runs
        assert run(lambda: _compile(128)) == []  # compiled for that shape: nothing
        (again,) = run(lambda: _compile(256))  # a new specialization: compiled again
        assert again.recompile is True
        evidence = spans.compile_evidence(again)
        assert evidence["ttft.compile.compiler"] == "triton"
        part.compiling = worker._Compiling(0.0, "1/0", False)  # inside a Dynamo compile
        assert run(lambda: _compile(512)) == []  # Inductor's kernel: that compile's time
        part.compiling = None
    finally:
        part.close()
        hook = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = None
    assert hook is not None and hook.__name__ == "<lambda>"  # the previous one put back
    assert knobs.runtime.jit_cache_hook is None


def test_compiles_after_close_are_not_noted_and_ours_stand_aside():
    """A hook installed on top of ours after us (vLLM's monitor activating late) keeps calling
    ours: closed, ours pass through and note nothing."""
    from triton import knobs

    noted = []
    watch = worker.TritonCompiles(lambda *a: noted.append(a))
    assert watch.install()
    ours = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: ours(**kw)  # chained on top of ours
    try:
        watch.remove()
        knobs.runtime.jit_post_compile_hook(fn=None)
        assert noted == []
        assert knobs.runtime.jit_cache_hook is None  # ours was still installed: taken back
    finally:
        knobs.runtime.jit_post_compile_hook = None
