"""scripts/gpu-check-torch on a CPU machine: the figures' logic and tolerances on synthetic numbers,
the "no CUDA device" exit, bad arguments, and that what the device run measures is our hooks
(the registry's objects, applied by the registry) around stand-ins shaped like vLLM's call sites.
The CUDA measurements themselves run only on a GPU (docs/gpu-checks.md)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import wrapt
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import all_hooks, warmup
from otel_ttft.runtime.hooks.load import weights as load_weights
from scripts import gpu_check_torch as check
from scripts import gpu_check_torch_figures as figures
from scripts import gpu_check_torch_standins as standins
from tests.otel_memory import memory_exporter

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _run(*argv: str, code: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m",
                                                     "scripts.gpu_check_torch", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# --- the figures, on synthetic numbers ------------------------------------------------------


def _h2d_attrs(nbytes, gbps):
    return {semconv.ATTR_H2D_BYTES: nbytes, semconv.ATTR_H2D_GB_PER_S: gbps}


def test_h2d_bytes_are_exact_and_gb_per_s_is_judged_against_the_event_copy():
    ok = figures.h2d_figures("pinned", _h2d_attrs(1024 * MiB, 20.0), 1024 * MiB, 22.0, True)
    assert [f.ok for f in ok] == [True, True, True]
    short = figures.h2d_figures("pinned", _h2d_attrs(1024 * MiB - 1, 20.0), 1024 * MiB, 22.0,
                                True)
    assert [f.ok for f in short] == [False, True, True]
    low, high = figures.H2D_RATIO
    assert not figures.h2d_figures("x", _h2d_attrs(1, 10.0 * low * 0.99), 1, 10.0, True)[1].ok
    assert figures.h2d_figures("x", _h2d_attrs(1, 10.0 * low * 1.01), 1, 10.0, True)[1].ok
    assert not figures.h2d_figures("x", _h2d_attrs(1, 10.0 * high * 1.01), 1, 10.0, True)[1].ok
    # a GB where a GiB was meant is inside; a factor of 1000 (bytes/ms) is not
    assert figures.h2d_figures("x", _h2d_attrs(1, 10.0 * 1e9 / 2**30), 1, 10.0, True)[1].ok
    assert not figures.h2d_figures("x", _h2d_attrs(1, 10.0 * 1000), 1, 10.0, True)[1].ok
    assert not figures.h2d_figures("x", _h2d_attrs(1, 10.0), 1, 10.0, False)[2].ok


def test_a_missing_h2d_span_fails_every_figure_it_carries():
    missing = figures.h2d_figures("pageable", {}, 1024, 10.0, True)
    assert [f.ok for f in missing[:2]] == [False, False]
    assert [f.ours for f in missing[:2]] == [None, None]
    assert not figures.ratio("p", "n", 1.0, 0.0, (0.5, 2)).ok  # no reference: not ok either


def _graph_attrs(count=3, sizes=(64, 8, 1), memory=100 * MiB):
    return {semconv.ATTR_STAGE: semconv.STAGE_WARMUP_GRAPH_CAPTURE,
            semconv.ATTR_GRAPH_COUNT: count, semconv.ATTR_GRAPH_BATCH_SIZES: sizes,
            semconv.ATTR_GRAPH_MEMORY_BYTES: memory}


def _graph_ok(attrs, sizes=(64, 8, 1), device=100 * MiB, reserved=96 * MiB, replays=True):
    return [f.ok for f in figures.graph_figures(attrs, list(sizes), device, reserved, replays)]


def test_graph_count_and_sizes_are_exact_in_capture_order():
    assert all(_graph_ok(_graph_attrs()))
    assert _graph_ok(_graph_attrs(count=2)) == [True, False, True, True, True, True]
    assert _graph_ok(_graph_attrs(sizes=(1, 8, 64))) == [True, True, False, True, True, True]
    assert not all(_graph_ok({**_graph_attrs(), semconv.ATTR_STAGE: "warmup"}))
    assert _graph_ok(_graph_attrs(), replays=False)[-1] is False


def test_graph_memory_against_the_driver_and_the_allocator():
    slack = figures.GRAPH_READING_SLACK
    assert _graph_ok(_graph_attrs(memory=100 * MiB + slack))[3]
    assert not _graph_ok(_graph_attrs(memory=100 * MiB + slack + 1))[3]
    assert not _graph_ok(_graph_attrs(memory=0), device=0)[4]  # below what the allocator took
    # the driver holds a little outside the allocator: bounded, not unlimited
    above = 96 * MiB + figures.RESERVED_ABOVE
    assert _graph_ok(_graph_attrs(memory=above), device=above)[4]
    assert not _graph_ok(_graph_attrs(memory=above + MiB), device=above + MiB)[4]
    big = 8 << 30  # a large pool: a quarter above it is still the pool's driver side
    assert _graph_ok(_graph_attrs(memory=int(big * 1.2)), device=int(big * 1.2), reserved=big)[4]
    assert not _graph_ok(_graph_attrs(memory=None))[3]


def test_kv_bytes_against_the_config_and_the_allocator():
    attrs = {semconv.ATTR_KV_BYTES: 512 * MiB, semconv.ATTR_KV_BLOCKS: 2048,
             semconv.ATTR_KV_BLOCK_SIZE: 16, semconv.ATTR_KV_TOKEN_CAPACITY: 2048 * 16}
    assert all(f.ok for f in figures.kv_figures(attrs, 1, 512 * MiB, 512 * MiB, 2048, 16))
    oks = [f.ok for f in figures.kv_figures(attrs, 2, 512 * MiB, 512 * MiB + 512, 2048, 16)]
    assert oks == [False, True, False, True, True, True]


def test_the_table_shows_every_figure_and_the_verdict():
    rows = figures.h2d_figures("pinned", _h2d_attrs(3 * MiB, 20.0), 3 * MiB, 21.0, True)
    rows += figures.hook_figures(["warmup.graph_capture"])
    table = figures.render(rows, {"device": "NVIDIA H200, 139 GiB"})
    lines = table.splitlines()
    assert lines[0] == "device: NVIDIA H200, 139 GiB"
    assert lines[1].split() == ["part", "figure", "ours", "reference", "rule"]
    assert "3.0 MiB" in lines[3] and "20.00 GB/s" in lines[4] and "21.00 GB/s" in lines[4]
    assert lines[-2].endswith("FAIL") and "[warmup.graph_capture]" in lines[-2]
    assert sum(line.endswith(" ok") for line in lines) == 3
    assert lines[-1] == "3/4 figures ok, 1 off"
    assert figures.exit_code(rows) == 1
    assert figures.exit_code(rows[:3]) == 0
    assert figures.exit_code([]) == 1  # nothing judged is not a pass
    assert "missing" in figures.render(figures.h2d_figures("p", {}, 1, 1.0, True), {})


# --- the script without a GPU ---------------------------------------------------------------


def _cuda_answers() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_answers(), reason="a CUDA device answers here: the script runs")
def test_without_cuda_the_script_exits_2_with_one_line():
    done = _run()
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no CUDA device" in done.stderr
    wrapper = subprocess.run([str(ROOT / "scripts" / "gpu-check-torch")], capture_output=True,
                             text=True, timeout=120, env={"PYTHON": sys.executable,
                                                          "PATH": "/usr/bin:/bin"})
    assert wrapper.returncode == 2 and "no CUDA device" in wrapper.stderr


def test_without_pytorch_it_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from scripts.gpu_check_torch import main; sys.exit(main([]))")
    done = _run(code=code)
    assert done.returncode == 2
    assert "no CUDA device (PyTorch is not installed)" in done.stderr


@pytest.mark.parametrize("argv", [["--h2d-mib", "0"], ["--tensor-mib", "x"],
                                  ["--h2d-mib", "64", "--tensor-mib", "128"],
                                  ["--mixed-sizes", "8,8"], ["--decode-sizes", "4,-1"],
                                  ["--mixed-sizes", "4", "--decode-sizes", "4"], ["--nope"]])
def test_bad_arguments_exit_2_with_one_line(argv):
    done = _run(*argv)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("gpu-check-torch: ") and "Traceback" not in done.stderr


def test_sizes_are_captured_largest_first():
    args = check.parse_args(["--mixed-sizes", "64,512,128", "--decode-sizes", "1,8"])
    assert args.mixed_sizes == [512, 128, 64] and args.decode_sizes == [8, 1]


# --- what the device run measures is ours ---------------------------------------------------


def test_the_checked_hooks_are_the_instrumentors_own():
    registered = all_hooks()
    assert all(any(hook is other for other in registered) for hook in standins.HOOKS)
    assert [h.wrapper for h in standins.HOOKS] == [load_weights._wrap_get_all_weights,
                                                   warmup._wrap_capture_cudagraphs,
                                                   warmup._wrap_initialize_kv_cache]
    for module, name in standins.VLLM_ACCESSORS:  # what the check answers for vLLM exists
        assert callable(getattr(module, name))


def _guarded_wrapper(attribute):
    """The hook function inside the registry's guard that wraps ``attribute``."""
    assert isinstance(attribute, wrapt.FunctionWrapper)
    fn = inspect.getclosurevars(attribute._self_wrapper).nonlocals["fn"]
    return fn.func if isinstance(fn, functools.partial) else fn  # its state part bound first


def test_hooked_applies_the_registry_wrappers_to_the_stand_ins_and_undoes_them():
    originals = {h.qualname: _lookup(standins, h.qualname) for h in standins.HOOKS}
    with standins.hooked():
        for hook in standins.HOOKS:
            owner, attr = hook.qualname.split(".")
            wrapped = getattr(standins, owner).__dict__[attr]
            assert _guarded_wrapper(wrapped) is hook.wrapper
            assert wrapped.__wrapped__ is originals[hook.qualname]
            assert hook.applied
    for hook in standins.HOOKS:
        assert _lookup(standins, hook.qualname) is originals[hook.qualname]
        assert not hook.applied


def _lookup(module, qualname):
    owner, attr = qualname.split(".")
    return getattr(module, owner).__dict__[attr]


def test_the_stand_ins_run_our_hooks_without_cuda_work():
    """Through the hooks with nothing to capture or allocate (as tests/test_gpu_paths.py does
    with vLLM's own methods): the spans get our figures, so the device run's wiring is right."""
    import torch

    exporter = memory_exporter()
    exporter.clear()
    counter = standins.CompilationCounter()
    weights = [(f"w{i}", torch.full((1024,), float(i))) for i in range(3)]
    params = {name: torch.empty(1024) for name, _ in weights}
    runner = standins.GPUModelRunner.__new__(standins.GPUModelRunner)  # no CUDA pool here
    runner.counter, runner.graphs = counter, {}
    with standins.hooked(), standins.vllm_answers(counter, lambda: True):
        standins.DefaultModelLoader(weights).load_weights(standins.WeightsModel(params), None)
        with trace.get_tracer("vllm").start_as_current_span("Capture model"):
            runner._capture_cudagraphs(batch_descriptors=[],
                                       cudagraph_runtime_mode=standins.CUDAGraphMode.FULL)
        config = standins.kv_cache_config(0, 64, 16, 4096)
        standins.Worker(runner).initialize_from_config(config)
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    assert spans["Load weights"][semconv.ATTR_H2D_BYTES] == 3 * 1024 * 4
    assert all(torch.equal(params[n], w) for n, w in weights)
    capture = spans["Capture model"]
    assert capture[semconv.ATTR_GRAPH_COUNT] == 0 and capture[semconv.ATTR_STAGE] == \
        semconv.STAGE_WARMUP_GRAPH_CAPTURE
    kv = spans["Allocate KV cache"]
    assert (kv[semconv.ATTR_KV_BLOCKS], kv[semconv.ATTR_KV_BLOCK_SIZE]) == (64, 16)
    assert kv[semconv.ATTR_STAGE] == semconv.STAGE_WARMUP_KV_ALLOC
    assert not any(h.failed for h in standins.HOOKS)


def _wheel_dists() -> set[str]:
    text = (ROOT / "scripts" / "gpu-wheels").read_text()
    return set(re.search(r"DISTS=\(([^)]*)\)", text).group(1).split())


_LOADED = r"""
import importlib.metadata as md, json, sys
sys.modules["vllm"] = None  # the GPU image has no vLLM
from scripts import gpu_check_torch as check, gpu_check_torch_figures
from scripts import gpu_check_torch_standins as standins
check._memory_exporter()
before_torch = set(sys.modules)
import torch  # the image has PyTorch: what its import brings is its own
of_torch = set(sys.modules) - before_torch
counter = standins.CompilationCounter()
runner = standins.GPUModelRunner.__new__(standins.GPUModelRunner)
runner.counter, runner.graphs = counter, {}
with standins.hooked(), standins.vllm_answers(counter, lambda: True):  # lazy imports too
    standins.DefaultModelLoader([("w", torch.ones(4))]).load_weights(
        standins.WeightsModel({"w": torch.empty(4)}), None)
    with standins._vllm_tracer().start_as_current_span("Capture model"):
        runner._capture_cudagraphs(batch_descriptors=[],
                                   cudagraph_runtime_mode=standins.CUDAGraphMode.FULL)
    standins.Worker(runner).initialize_from_config(standins.kv_cache_config(0, 4, 16, 4096))
assert not any(h.failed for h in standins.HOOKS)
files = {getattr(sys.modules[m], "__file__", None) for m in set(sys.modules) - of_torch} - {None}
names = set()
for dist in md.distributions():
    if any(str(dist.locate_file(f)) in files for f in dist.files or () if f.suffix == ".py"):
        names.add(dist.metadata["Name"].lower().replace("_", "-"))
print(json.dumps(sorted(names)))
"""


def _requirement_closure(name: str) -> set[str]:
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen, todo = set(), [name]
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return seen


def test_the_wheels_cover_what_the_check_imports_beside_pytorch():
    done = _run(code=_LOADED)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    allowed = _wheel_dists() | {"otel-ttft"} | _requirement_closure("torch")  # torch's: the image's
    assert loaded - allowed == set()
    assert {"opentelemetry-sdk", "wrapt"} <= loaded  # the probe sees real imports


# --- the stand-ins keep vLLM's shape (the installed vLLM is the reference) -------------------


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_stand_ins_have_vllms_names_and_signatures():
    import importlib

    for hook in standins.HOOKS:
        real = importlib.import_module(hook.module)
        owner, attr = hook.qualname.split(".")
        ours = getattr(standins, owner).__dict__[attr]
        theirs = getattr(real, owner).__dict__[attr]
        assert inspect.signature(ours).parameters.keys() == \
            inspect.signature(theirs).parameters.keys(), hook.target
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.v1.worker.gpu_worker import Worker

    for ours, theirs in ((standins.DefaultModelLoader.load_weights,
                          DefaultModelLoader.load_weights),
                         (standins.Worker.initialize_from_config, Worker.initialize_from_config)):
        assert inspect.signature(ours).parameters.keys() == \
            inspect.signature(theirs).parameters.keys()


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_stand_in_data_has_vllms_fields():
    from vllm.compilation.counter import compilation_counter
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1 import kv_cache_interface as kv

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert fields(standins.BatchDescriptor) <= fields(BatchDescriptor)
    assert fields(standins.KVCacheConfig) <= fields(kv.KVCacheConfig)
    assert fields(standins.KVCacheTensor) <= fields(kv.KVCacheTensor)
    assert fields(standins.KVCacheGroupSpec) <= fields(kv.KVCacheGroupSpec)
    assert {m.name for m in standins.CUDAGraphMode} <= set(CUDAGraphMode.__members__)
    assert fields(standins.CompilationCounter) <= fields(type(compilation_counter))
    assert "block_size" in fields(kv.FullAttentionSpec)
    # what our accessors return from the real vLLM: the counter, and "not an accelerator" here
    assert warmup._compilation_counter() is compilation_counter
    from otel_ttft.runtime.hooks.load import shards

    assert shards.device_is_accelerator() is False


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--all"], {}, "takes no arguments"),
    ([], {"GPU_PY": "3.12; rm -rf /"}, "GPU_PY must be a CPython version"),
    ([], {"PYTHON": "/nonexistent/python"}, "has no pip"),
])
def test_gpu_wheels_refuses_bad_input_before_downloading(argv, env, message):
    done = subprocess.run([str(ROOT / "scripts" / "gpu-wheels"), *argv], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr
