"""The parts of the bare GPU check (``gpu_check_bare``), each ``part(run) -> figures``; a part
that needs CUDA returns "skip" rows with the reason on a dry run."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import msgspec

from otel_ttft import semconv
from otel_ttft.runtime.hooks import capture, request, warmup
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load import weights as load_weights
from otel_ttft.runtime.hooks.request.payload import WORKER_NOTES_ATTR, CompileTime, GraphDispatch
from scripts import gpu_check_bare_figures as figures
from scripts import gpu_check_bare_model as model
from scripts import gpu_check_bare_v1 as v1
from scripts import gpu_check_bare_v2 as v2
from scripts.gpu_check_bare_disk import (
    drop,
    plain_read_gb_per_s,
    resident,
    shapes_of,
    write_checkpoint,
)

MiB = 1 << 20
NO_CUDA = "needs CUDA (dry run)"

HOOKS_V1 = [load_weights.GET_ALL_WEIGHTS, load_weights.SAFE_OPEN, load_weights.SAFETENSORS_READS,
            capture.GRAPH_CAPTURE, warmup.KV_ALLOC]
"""Our hooks on vLLM's V1 names: the very objects the instrumentor registers."""
HOOKS_V2 = [capture.GRAPH_CAPTURE_V2, capture.GRAPH_CAPTURE_V2_SHAPES, warmup.KV_ALLOC_V2,
            *(h for h in request.HOOKS if h.name in ("request.step_execute",
                                                      "request.graph_dispatch_v2"))]
"""... on Model Runner V2's names and the worker's step."""
VLLM_ACCESSORS = [(load_shards, "device_is_accelerator"), (capture, "compilation_counter")]
"""Where our code asks vLLM itself (not a call site): answered as vLLM would on this GPU."""


def memory_exporter() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


class Run:
    """One run: torch, the options, the span exporter, vLLM's counter (stand-in)."""

    def __init__(self, torch: Any, args: Any, exporter: Any, cuda: bool) -> None:
        self.torch, self.args, self.exporter, self.cuda = torch, args, exporter, cuda
        self.counter = model.CompilationCounter()
        self.state: Any = None

    def device_name(self) -> str:
        if not self.cuda:
            return "CPU only"
        props = self.torch.cuda.get_device_properties(0)
        return f"{props.name}, {props.total_memory / (1 << 30):.0f} GiB"

    @contextlib.contextmanager
    def hooked(self) -> Iterator[list[Any]]:
        """Our hooks applied by the registry to the stand-in modules, with the process state
        ``_instrument`` makes; vLLM's two answers given; all undone on exit."""
        from otel_ttft.runtime import config
        from otel_ttft.runtime.hooks import all_parts
        from otel_ttft.runtime.hooks.registry import HookSet
        from otel_ttft.runtime.state import ProcessState

        self.state = ProcessState(config.Config(), all_parts())
        sets = [(HookSet(list(HOOKS_V1), self.state), v1),
                (HookSet(list(HOOKS_V2), self.state), v2)]
        answers = {"device_is_accelerator": lambda: self.cuda,
                   "compilation_counter": lambda: self.counter}
        with contextlib.ExitStack() as stack:
            for module, name in VLLM_ACCESSORS:
                stack.enter_context(mock.patch.object(module, name, answers[name]))
            for hook_set, module in sets:
                hook_set.apply_to(module)
            try:
                yield [hook_set for hook_set, _ in sets]
            finally:
                for hook_set, module in sets:
                    hook_set.remove(module)
                self.state.close()

    def spans(self, name: str) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def attrs(self, name: str) -> dict[str, Any]:
        found = self.spans(name)
        return dict(found[-1].attributes or {}) if found else {}


# --- 1. H2D --------------------------------------------------------------------------------------

def _event_gb_per_s(torch: Any, pairs: list[tuple[Any, Any]], repeats: int = 3) -> float:
    """The same copies, timed on the device by a cuda.Event pair; the median of ``repeats``."""
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for param, host in pairs:
            param.copy_(host)
        end.record()
        end.synchronize()
        rates.append(sum(h.numel() * h.element_size() for _, h in pairs)
                     / (start.elapsed_time(end) / 1e3) / 1e9)
    return statistics.median(rates)


def h2d(run: Run) -> list[Any]:
    if not run.cuda:
        return [figures.skip(f"H2D {kind}", "host-to-device copies", NO_CUDA)
                for kind in ("pinned", "pageable")]
    torch, args, rows = run.torch, run.args, []
    for pinned in (True, False):
        count, numel = args.h2d_mib // args.tensor_mib, args.tensor_mib * MiB // 2
        names = [f"model.layers.{i}.mlp.weight" for i in range(count)]
        host = [torch.empty(numel, dtype=torch.bfloat16, pin_memory=pinned).fill_(i % 100)
                for i in range(count)]
        params = {n: torch.empty(numel, dtype=torch.bfloat16, device="cuda") for n in names}
        params[names[0]].copy_(host[0])  # first-copy set-up outside both timings
        torch.cuda.synchronize()
        run.exporter.clear()
        v1.DefaultModelLoader(host_weights=list(zip(names, host, strict=True))).load_weights(
            v1.WeightsModel(params), model_config=None)
        intact = all(torch.equal(params[n], torch.full_like(params[n], i % 100))
                     for i, n in enumerate(names))
        event = _event_gb_per_s(torch, [(params[n], h) for n, h in zip(names, host, strict=True)])
        rows += figures.h2d_figures("pinned" if pinned else "pageable", run.attrs("Load weights"),
                                    sum(h.numel() * h.element_size() for h in host), event,
                                    intact)
        del host, params
        torch.cuda.empty_cache()
    return rows


# --- 2. disk and PCIe apart -----------------------------------------------------------------------

def _load(run: Run, path: str, device: str, shapes: dict[str, list[int]]) -> dict[str, Any]:
    torch = run.torch
    params = {n: torch.empty(s, dtype=torch.bfloat16, device=device) for n, s in shapes.items()}
    run.exporter.clear()
    v1.DefaultModelLoader(files=[path]).load_weights(v1.WeightsModel(params), model_config=None)
    if device == "cuda":
        torch.cuda.synchronize()
    shard = run.attrs(semconv.SPAN_SHARD_READ)
    return {**shard, **run.attrs("Load weights")}


def disk_and_pcie(run: Run) -> list[Any]:
    part = "load cold/warm"
    try:
        import safetensors  # noqa: F401
    except ImportError:
        return [figures.skip(part, "safetensors loads", "safetensors is not installed")]
    path, tensor_bytes = write_checkpoint(run.torch, run.args.dir, run.args.file_mib)
    try:
        device, shapes = "cuda" if run.cuda else "cpu", shapes_of(path)
        disk = (drop(path), plain_read_gb_per_s(path))[1]
        dropped = drop(path)
        before = resident(path)
        cold = _load(run, path, device, shapes)
        warm = _load(run, path, device, shapes)
        rows = figures.load_figures(part, cold, warm, dropped, before, os.path.getsize(path),
                                    tensor_bytes, disk)
        if not run.cuda:  # no device: the copy figures are not this machine's to judge
            rows = [r if "h2d" not in r.name else figures.skip(part, r.name, NO_CUDA)
                    for r in rows]
        return rows
    finally:
        os.unlink(path)


# --- 3. graph capture ----------------------------------------------------------------------------

def _plan(args: Any) -> tuple[list[int], list[int]]:
    piecewise = list(args.sizes)
    full = [n for n in args.sizes if n <= args.max_num_seqs]
    return piecewise, full


def _replays_match(torch: Any, net: model.PiecewiseModel) -> bool:
    ok = True
    for n in [*net.full, *net.pieces]:
        for mode in ("FULL", "PIECEWISE"):
            if n not in (net.full if mode == "FULL" else net.pieces):
                continue
            net.inputs[0][:n].normal_()
            graphed = net.replay(mode, n).clone()
            ok = ok and torch.allclose(graphed, net.eager(n), rtol=2e-2, atol=2e-2)
    return ok


def graphs(run: Run) -> list[Any]:
    if not run.cuda:
        return [figures.skip(f"graphs {r}", "CUDA graph capture", NO_CUDA) for r in ("V1", "V2")]
    torch, args, rows = run.torch, run.args, []
    piecewise, full = _plan(args)
    for runner_name in ("V1", "V2"):
        net = model.PiecewiseModel(torch, args.hidden, args.layers, max(max(args.sizes), 1024),
                                   run.counter)
        net.eager(max(args.sizes))  # the profile run: the eager pool holds the largest activations
        torch.cuda.synchronize()  # (kept: V2's warm-ups outside the shapes' readings reuse it)
        run.exporter.clear()
        if runner_name == "V1":
            plan = [(model.PIECEWISE, [model.BatchDescriptor(n) for n in piecewise]),
                    (model.FULL, [model.BatchDescriptor(n, n, True) for n in full])]
            reserved = torch.cuda.memory_reserved()
            start = time.monotonic()
            driver = v1.GPUModelRunner(net).capture_model(plan)
        else:
            manager = v2.CudaGraphManager(args.sizes, model.FULL_AND_PIECEWISE, args.max_num_seqs)
            runner = v2.GPUModelRunner(net, manager)
            runner.capture_model(profile_only=True)  # vLLM's estimate first: not the stage
            reserved = torch.cuda.memory_reserved()
            start = time.monotonic()
            driver = runner.capture_model()
            run.v2_runner = runner
        wall = time.monotonic() - start
        reserved = torch.cuda.memory_reserved() - reserved
        spans = run.spans(semconv.SPAN_GRAPH_CAPTURE)
        span_s = (spans[-1].end_time - spans[-1].start_time) / 1e9 if spans else None
        rows += figures.graph_figures(f"graphs {runner_name}",
                                      run.attrs(semconv.SPAN_GRAPH_CAPTURE), net.captured,
                                      driver, reserved, _replays_match(torch, net), span_s, wall)
        rows.append(figures.exact(f"graphs {runner_name}", "Capture model spans (profiling "
                                  "call left alone)", len(spans), 1))
    return rows


# --- 4. KV cache ---------------------------------------------------------------------------------

def kv(run: Run) -> list[Any]:
    torch, args, rows = run.torch, run.args, []
    device = "cuda" if run.cuda else "cpu"
    config = model.hybrid_kv_config(args.kv_blocks, 16, 64 * 1024, args.layers)
    backing = max(t.size for t in config.kv_cache_tensors)
    for name, runner in (("V1", v1.GPUModelRunner(None, device)),
                         ("V2", v2.GPUModelRunner(None, None, device))):
        run.exporter.clear()
        runner.initialize_kv_cache(model.hybrid_kv_config(1, 16, 64 * 1024, args.layers),
                                   is_profiling=True)  # vLLM's profiling pass: not the stage
        runner.kv_caches = {}
        if run.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        allocated = torch.cuda.memory_allocated() if run.cuda else None
        v1.Worker(runner).initialize_from_config(config)
        if run.cuda:
            allocated = torch.cuda.memory_allocated() - allocated
        spans = run.spans(semconv.SPAN_KV_ALLOC)
        rows += figures.kv_figures(f"KV {name}", run.attrs(semconv.SPAN_KV_ALLOC), len(spans),
                                   backing, allocated, args.kv_blocks,
                                   len(config.kv_cache_groups))
        runner.kv_caches = {}
    return rows


# --- 5. serving steps, 6. first use --------------------------------------------------------------

def _notes(output: Any) -> list[Any]:
    notes = getattr(output, WORKER_NOTES_ATTR, None)
    return list(notes.notes) if notes is not None else []


def _choice(output: Any) -> dict[str, Any] | None:
    found = [msgspec.structs.asdict(n.choice) for n in _notes(output)
             if isinstance(n, GraphDispatch)]
    return found[-1] if found else None


def steps(run: Run) -> list[Any]:
    if not run.cuda or getattr(run, "v2_runner", None) is None:
        return [figures.skip("steps V2", "graph decisions, device syncs", NO_CUDA)]
    torch, runner = run.torch, run.v2_runner
    worker, rows = v2.Worker(runner), []
    piecewise, full = _plan(run.args)
    longest = max(run.args.sizes) + 1
    prompts = [("short", 5), ("medium", 100), ("long", longest)]
    errors: dict[bool, str | None] = {}
    for hooked in (False, True):
        unhooked = contextlib.nullcontext() if hooked else _unhooked(run)
        with unhooked:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                outputs = [worker.execute_model(v2.prefill_step(f"{label}-{hooked}", n))
                           for label, n in prompts]
                errors[hooked] = None
            except RuntimeError as exc:
                errors[hooked], outputs = str(exc).splitlines()[0][:80], []
            finally:
                torch.cuda.set_sync_debug_mode("default")
    ran = runner.ran[-len(prompts):]
    for (label, _), output, what in zip(prompts, outputs, ran, strict=False):
        rows += figures.step_figures("steps V2", f"{label} prefill", _choice(output), what,
                                     max(piecewise), max(full))
    runner.cudagraph_metrics = True  # --cudagraph-metrics: vLLM's own record says what ran
    output = worker.execute_model(v2.prefill_step("recorded", 5))
    rows.append(figures.exact("steps V2", "source with --cudagraph-metrics",
                              (_choice(output) or {}).get("source"), "cudagraph_stats"))
    runner.cudagraph_metrics = False
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.zeros(1, device="cuda").item()
        caught = False
    except RuntimeError:
        caught = True
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return rows + figures.sync_figures("steps V2", errors.get(True), errors.get(False), caught)


@contextlib.contextmanager
def _unhooked(run: Run) -> Iterator[None]:
    """The step path without our wrappers (the stand-in's own syncs, if any)."""
    step, dispatch = v2.Worker.execute_model, v2.CudaGraphManager.dispatch
    with mock.patch.object(v2.Worker, "execute_model", step.__wrapped__), \
            mock.patch.object(v2.CudaGraphManager, "dispatch", dispatch.__wrapped__):
        yield


def first_use(run: Run) -> list[Any]:
    part = "first use"
    if not run.cuda or getattr(run, "v2_runner", None) is None:
        return [figures.skip(part, "Triton compile inside a step", NO_CUDA)]
    try:
        from scripts import gpu_check_bare_kernels as kernels
    except ImportError as exc:
        return [figures.skip(part, "Triton compile inside a step", f"no Triton: {exc}")]
    torch, runner = run.torch, run.v2_runner
    worker, timed = v2.Worker(runner), []

    def launch(out: Any) -> None:
        start = time.perf_counter()
        kernels.launch(out)
        torch.cuda.synchronize()  # the script's reading: the launch, compile included
        timed.append(time.perf_counter() - start)

    runner.step_work = launch
    try:
        first = worker.execute_model(v2.prefill_step("first-use", 5))
        second = worker.execute_model(v2.prefill_step("second-use", 5))
    finally:
        runner.step_work = None
    compiled = [msgspec.structs.asdict(n) for n in _notes(first) if isinstance(n, CompileTime)]
    again = [n for n in _notes(second) if isinstance(n, CompileTime)]
    return figures.first_use_figures(part, compiled, again, timed[0], timed[1])


PARTS = [h2d, disk_and_pcie, graphs, kv, steps, first_use]

if __name__ == "__main__":
    sys.exit("run scripts/gpu-check-bare")
