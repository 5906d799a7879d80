"""scripts/gpu-check-bare on a CPU machine: the figures' logic and tolerances on synthetic
numbers, the dry run (what needs no CUDA, run for real: the shared KV layout, cold and warm
safetensors reads against mincore and a plain read), "no CUDA device", bad arguments, and that
what the device run measures is our hooks (the registry's objects, applied by the registry) on
stand-ins with vLLM's names and signatures. The CUDA parts run only on a GPU
(docs/gpu-checks.md)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import wrapt

from otel_ttft import semconv
from otel_ttft.runtime.hooks import all_hooks
from scripts import gpu_check_bare as check
from scripts import gpu_check_bare_disk as disk
from scripts import gpu_check_bare_figures as figures
from scripts import gpu_check_bare_model as model
from scripts import gpu_check_bare_parts as parts
from scripts import gpu_check_bare_v1 as v1
from scripts import gpu_check_bare_v2 as v2

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _run(*argv: str, code: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m",
                                                     "scripts.gpu_check_bare", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# --- the figures, on synthetic numbers ------------------------------------------------------


def _captured(full=(8, 4), piecewise=(64, 32, 16), pieces=4, memory=(10 * MiB, 90 * MiB)):
    c = model.Captured()
    c.sizes = {"FULL": list(full), "PIECEWISE": list(piecewise)}
    c.graphs = {"FULL": len(full), "PIECEWISE": pieces * len(piecewise)}
    c.memory = {"FULL": memory[0], "PIECEWISE": memory[1]}
    return c


def _graph_attrs(**over):
    attrs = {semconv.ATTR_STAGE: semconv.STAGE_WARMUP_GRAPH_CAPTURE,
             semconv.ATTR_GRAPH_FULL_BATCH_SIZES: [8, 4], semconv.ATTR_GRAPH_FULL_COUNT: 2,
             semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES: [64, 32, 16],
             semconv.ATTR_GRAPH_PIECEWISE_COUNT: 3, semconv.ATTR_GRAPH_PIECEWISE_PIECES: 12,
             semconv.ATTR_GRAPH_COUNT: 14, semconv.ATTR_GRAPH_MEMORY_BYTES: 100 * MiB,
             semconv.ATTR_GRAPH_FULL_MEMORY_BYTES: 10 * MiB,
             semconv.ATTR_GRAPH_PIECEWISE_MEMORY_BYTES: 90 * MiB}
    return {**attrs, **over}


def _graph_ok(attrs, captured=None, driver=100 * MiB, reserved=96 * MiB, span=0.95, wall=1.0):
    rows = figures.graph_figures("g", attrs, captured or _captured(), driver, reserved, True,
                                 span, wall)
    return {r.name: r.ok for r in rows}


def test_graph_figures_count_full_and_piecewise_apart():
    assert all(_graph_ok(_graph_attrs()).values())
    # what a count of the counter alone, sizes of the full graphs only, gave before issue 55
    old = _graph_ok({semconv.ATTR_STAGE: semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                     semconv.ATTR_GRAPH_COUNT: 14, semconv.ATTR_GRAPH_BATCH_SIZES: [4, 8],
                     semconv.ATTR_GRAPH_MEMORY_BYTES: 100 * MiB})
    assert not old["ttft.graph.piecewise.batch_sizes vs piecewise captured"]
    assert not old["ttft.graph.piecewise.pieces vs piece graphs captured"]
    bad = _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_PIECEWISE_PIECES: 3}))
    assert [k for k, ok in bad.items() if not ok] == \
        ["ttft.graph.piecewise.pieces vs piece graphs captured"]
    assert not _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_FULL_MEMORY_BYTES: 20 * MiB}))[
        "full + piecewise memory vs driver per mode"]
    assert not _graph_ok(_graph_attrs(), span=1.2)["Capture model span vs the script's clock"]


def test_graph_memory_against_the_driver_and_the_allocator():
    slack = figures.GRAPH_READING_SLACK
    name = "ttft.graph.memory_bytes vs driver"
    assert _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_MEMORY_BYTES: 100 * MiB + slack}))[name]
    assert not _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_MEMORY_BYTES: 100 * MiB + slack + 1})
                         )[name]
    above = 96 * MiB + figures.RESERVED_ABOVE
    allocator = "ttft.graph.memory_bytes vs allocator reserved"
    assert _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_MEMORY_BYTES: above}), driver=above)[
        allocator]
    assert not _graph_ok(_graph_attrs(**{semconv.ATTR_GRAPH_MEMORY_BYTES: above + MiB}),
                         driver=above + MiB)[allocator]


def test_kv_bytes_are_the_shared_allocation_once():
    attrs = {semconv.ATTR_KV_BYTES: 512 * MiB, semconv.ATTR_KV_BLOCKS: 2048}
    rows = figures.kv_figures("KV", attrs, 1, 512 * MiB, 512 * MiB, 2048, 2)
    assert all(r.ok for r in rows)
    doubled = {**attrs, semconv.ATTR_KV_BYTES: 1024 * MiB}  # summed once per group: the defect
    assert [r.ok for r in figures.kv_figures("KV", doubled, 1, 512 * MiB, 512 * MiB, 2048, 2)] \
        == [True, False, False, True]
    dry = figures.kv_figures("KV", attrs, 1, 512 * MiB, None, 2048, 2)
    assert [r.skipped for r in dry] == [False, False, True, False]


def test_load_figures_keep_the_disk_out_of_the_copy():
    cold = {semconv.ATTR_H2D_BYTES: 100, semconv.ATTR_H2D_GB_PER_S: 20.0,
            semconv.ATTR_READ_GB_PER_S: 2.0, semconv.ATTR_PAGE_CACHE_RESIDENT: 0.0,
            semconv.ATTR_SHARD_BYTES: 200}
    warm = {semconv.ATTR_H2D_GB_PER_S: 22.0}
    rows = figures.load_figures("l", cold, warm, 0.0, 0.0, 200, 100, 2.5)
    assert all(r.ok for r in rows)
    slow_link = {**cold, semconv.ATTR_H2D_GB_PER_S: 2.0}  # the disk timed as PCIe
    assert not figures.load_figures("l", slow_link, warm, 0.0, 0.0, 200, 100, 2.5)[1].ok
    absurd = {**cold, semconv.ATTR_READ_GB_PER_S: 40.0}  # a read timed without its faults
    assert not figures.load_figures("l", absurd, warm, 0.0, 0.0, 200, 100, 2.5)[2].ok
    kept = figures.load_figures("l", cold, warm, 0.9, 0.9, 200, 100, 2.5)  # tmpfs: no cold read
    assert [r.skipped for r in kept] == [False, True, True, True]


def test_step_sync_and_first_use_figures():
    choice = {"mode": "PIECEWISE", "padded": 8, "max_piecewise": 512, "max_full": 32}
    assert all(r.ok for r in figures.step_figures("s", "short", choice, ("PIECEWISE", 8), 512, 32))
    old = {**choice, "max_captured": 32, "max_piecewise": None}  # the largest full graph only
    assert not all(r.ok for r in figures.step_figures("s", "short", old, ("PIECEWISE", 8), 512,
                                                      32))
    assert [r.ok for r in figures.sync_figures("s", None, None, True)] == [True, True, True]
    assert [r.ok for r in figures.sync_figures("s", "synchronizing", None, True)][0] is False
    assert not figures.sync_figures("s", None, None, False)[2].ok  # the mode caught nothing
    note = {"start": 1.0, "end": 1.4, "compiler": "triton",
            "frame": "gpu_check_bare_kernels.py:scale_rows"}
    assert all(r.ok for r in figures.first_use_figures("f", [note], [], 0.5, 0.001))
    assert not figures.first_use_figures("f", [], [], 0.5, 0.001)[0].ok
    assert not figures.first_use_figures("f", [note], [note], 0.5, 0.001)[-1].ok


def test_the_table_counts_skips_apart():
    rows = [figures.exact("p", "a", 1, 1), figures.skip("p", "b", "needs CUDA (dry run)"),
            figures.exact("p", "c", 1, 2)]
    table = figures.render(rows, {"device": "CPU only"})
    assert table.splitlines()[-1] == "1/2 figures ok, 1 off, 1 skipped"
    assert figures.exit_code(rows) == 1
    assert figures.exit_code(rows[:2]) == 0
    assert figures.exit_code(rows[1:2]) == 1  # nothing judged is not a pass


# --- the script on this CPU machine ---------------------------------------------------------


def _cuda_answers() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_answers(), reason="a CUDA device answers here: the script runs")
def test_without_cuda_the_script_exits_2_with_one_line():
    done = _run()
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert "no CUDA device" in done.stderr and "--dry-run" in done.stderr


def test_without_pytorch_it_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from scripts.gpu_check_bare import main; sys.exit(main(['--dry-run']))")
    done = _run(code=code)
    assert done.returncode == 2
    assert "no CUDA device (PyTorch is not installed)" in done.stderr


@pytest.mark.parametrize("argv", [["--h2d-mib", "0"], ["--tensor-mib", "x"],
                                  ["--h2d-mib", "64", "--tensor-mib", "128"],
                                  ["--sizes", "8,8"], ["--sizes", "4,-1"],
                                  ["--dir", "/nonexistent/dir"], ["--nope"]])
def test_bad_arguments_exit_2_with_one_line(argv):
    done = _run(*argv)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("gpu-check-bare: ") and "Traceback" not in done.stderr


@pytest.mark.skipif(_cuda_answers(), reason="a CUDA device answers here: no dry run")
def test_the_dry_run_judges_what_needs_no_cuda(tmp_path):
    """Real safetensors files, cold and warm reads through our real load hooks, mincore, the
    shared two-group KV layout through our real KV hook; every CUDA figure a skip with why."""
    done = _run("--dry-run", "--file-mib", "128", "--kv-blocks", "64", "--dir", str(tmp_path))
    lines = done.stdout.splitlines()
    assert done.returncode in (0, 1), done.stderr
    rows = {tuple(line.split("  ")[:1] + [line[16:71].strip()]): line for line in lines[6:-1]}
    assert rows, done.stdout
    skipped = [line for line in lines if line.endswith(" skip")]
    assert any("needs CUDA (dry run)" in line for line in skipped)
    assert any("no CUDA allocator here (dry run)" in line for line in skipped)
    judged = [line for line in lines if line.endswith((" ok", "FAIL"))]
    assert any("shard bytes vs the file" in line and line.endswith(" ok") for line in judged)
    assert any("enriched spans (profiling call left alone)" in line and line.endswith(" ok")
               for line in judged)
    assert any("ttft.kv.bytes vs the one backing allocation (2 groups)" in line
               for line in judged)
    assert any("hooks that failed and stood aside" in line and line.endswith(" ok")
               for line in judged)
    assert list(tmp_path.iterdir()) == []  # the checkpoint it wrote is gone


def test_mincore_reading_follows_the_page_cache(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * (4 * MiB))
    path.read_bytes()
    assert disk.resident(str(path)) == 1.0
    dropped = disk.drop(str(path))
    if dropped > figures.DROPPED_AT_MOST:
        pytest.skip(f"this file system keeps the pages ({dropped:.0%}): tmpfs?")
    assert dropped <= figures.DROPPED_AT_MOST


# --- what the device run measures is ours ---------------------------------------------------


def test_the_checked_hooks_are_the_instrumentors_own():
    registered = all_hooks()
    for hook in [*parts.HOOKS_V1, *parts.HOOKS_V2]:
        assert any(hook is other for other in registered), hook.name
    assert {h.name for h in parts.HOOKS_V2} >= {"warmup.graph_capture_v2",
                                                "warmup.graph_capture_v2_shapes",
                                                "request.graph_dispatch_v2",
                                                "request.step_execute"}
    for module, name in parts.VLLM_ACCESSORS:
        assert callable(getattr(module, name))


def _guarded_wrapper(attribute):
    assert isinstance(attribute, wrapt.FunctionWrapper)
    fn = inspect.getclosurevars(attribute._self_wrapper).nonlocals["fn"]
    return fn.func if isinstance(fn, functools.partial) else fn


def _lookup(module, qualname):
    if "." not in qualname:
        return module.__dict__[qualname]
    owner, attr = qualname.split(".")
    return getattr(module, owner).__dict__[attr]


def test_hooked_applies_the_registry_wrappers_to_the_stand_ins_and_undoes_them():
    sets = ((parts.HOOKS_V1, v1), (parts.HOOKS_V2, v2))
    originals = {(m.__name__, h.qualname): _lookup(m, h.qualname) for hs, m in sets for h in hs}
    run = parts.Run(None, SimpleNamespace(), parts.memory_exporter(), cuda=False)
    with run.hooked():
        for hooks, module in sets:
            for hook in hooks:
                wrapped = _lookup(module, hook.qualname)
                assert _guarded_wrapper(wrapped) is hook.wrapper, hook.name
                assert wrapped.__wrapped__ is originals[(module.__name__, hook.qualname)]
    for hooks, module in sets:
        for hook in hooks:
            assert _lookup(module, hook.qualname) is originals[(module.__name__, hook.qualname)]
            assert not hook.applied


_LOADED = r"""
import importlib.metadata as md, json, sys
sys.modules["vllm"] = None  # the GPU image has no vLLM
before_torch = set(sys.modules)
import torch  # the image has PyTorch: what its import brings is its own
of_torch = set(sys.modules) - before_torch
from scripts import gpu_check_bare as check
sys.exit_code = check.main(["--dry-run", "--file-mib", "64", "--kv-blocks", "8",
                            "--dir", sys.argv[1]])
files = {getattr(sys.modules[m], "__file__", None) for m in set(sys.modules) - of_torch} - {None}
names = set()
for dist in md.distributions():
    if any(str(dist.locate_file(f)) in files for f in dist.files or () if f.suffix == ".py"):
        names.add(dist.metadata["Name"].lower().replace("_", "-"))
print("LOADED " + json.dumps(sorted(names)))
"""


def _wheel_dists() -> set[str]:
    text = (ROOT / "scripts" / "gpu-wheels").read_text()
    return set(re.search(r"DISTS=\(([^)]*)\)", text).group(1).split())


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


def test_the_wheels_cover_what_the_check_imports_beside_pytorch(tmp_path):
    done = subprocess.run([sys.executable, "-c", _LOADED, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("LOADED ")), None)
    assert line is not None, done.stderr
    loaded = set(json.loads(line[len("LOADED "):]))
    # numpy: safetensors and torch use it when it is there; without it the loads run (below)
    allowed = _wheel_dists() | {"otel-ttft", "numpy"} | _requirement_closure("torch")
    assert loaded - allowed == set()
    assert {"opentelemetry-sdk", "wrapt", "safetensors"} <= loaded  # the probe sees real imports
    without_numpy = ("import sys; sys.modules['numpy'] = None\n"
                     "import torch\nfrom scripts import gpu_check_bare_parts as p\n"
                     "path, n = p.write_checkpoint(torch, sys.argv[1], 64)\n"
                     "assert len(p.shapes_of(path)) == 1\nimport os; os.unlink(path)")
    done = subprocess.run([sys.executable, "-c", without_numpy, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the stand-ins keep vLLM's shape (the installed vLLM is the reference) -------------------


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("hooks", "module"), [(parts.HOOKS_V1, v1), (parts.HOOKS_V2, v2)],
                         ids=["V1", "V2"])
def test_the_stand_ins_have_vllms_names_and_signatures(hooks, module):
    for hook in hooks:
        real = importlib.import_module(hook.module)
        ours, theirs = _lookup(module, hook.qualname), _lookup(real, hook.qualname)
        ours_params = list(inspect.signature(ours).parameters)
        theirs_params = list(inspect.signature(theirs).parameters)
        assert ours_params == theirs_params[:len(ours_params)], hook.target
    from vllm.v1.worker.gpu_worker import Worker

    assert list(inspect.signature(v1.Worker.initialize_from_config).parameters) == \
        list(inspect.signature(Worker.initialize_from_config).parameters)


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_stand_in_data_has_vllms_fields():
    from vllm.compilation.cuda_graph import CUDAGraphStat
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1 import kv_cache_interface as kv
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)}

    assert fields(model.BatchDescriptor) <= fields(BatchDescriptor)
    assert fields(model.BatchExecutionDescriptor) <= fields(BatchExecutionDescriptor)
    assert fields(model.CUDAGraphStat) == fields(CUDAGraphStat)
    assert fields(model.KVCacheConfig) <= fields(kv.KVCacheConfig)
    assert fields(model.KVCacheTensor) <= fields(kv.KVCacheTensor)
    assert {m.name for m in (model.NONE, model.PIECEWISE, model.FULL,
                             model.FULL_AND_PIECEWISE)} <= set(CUDAGraphMode.__members__)
    assert model.FULL_AND_PIECEWISE.mixed_mode().name == \
        CUDAGraphMode.FULL_AND_PIECEWISE.mixed_mode().name
    assert model.FULL.mixed_mode().name == CUDAGraphMode.FULL.mixed_mode().name


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


def test_parse_args_keeps_sizes_largest_first():
    args = check.parse_args(["--sizes", "64,512,128"])
    assert args.sizes == [512, 128, 64]


def test_the_docs_table_has_every_figure_doctor_prints():
    from otel_ttft.tools import gpu_figures

    lines = (ROOT / "docs" / "gpu-checks.md").read_text().splitlines()
    for figure in gpu_figures.FIGURES:
        row = next((line for line in lines if line.startswith(f"| `{figure.attributes[0]}`")),
                   None)
        assert row is not None, figure.attributes
        assert all(f"`{name}`" in row for name in figure.attributes), row
    assert gpu_figures.rows(True) != gpu_figures.rows(False)
