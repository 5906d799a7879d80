"""The GPU figures, as data: how each is measured on the V1 and on the V2 model runner, and what
checked it (a CPU test on vLLM's real classes, a device check's independent reading). ``otel-ttft
doctor`` prints the rows for the runner vLLM would build; docs/gpu-checks.md has the same table
(``tests/test_gpu_check_bare.py`` keeps the two together)."""

from __future__ import annotations

from dataclasses import dataclass

from otel_ttft import semconv


@dataclass(frozen=True)
class GpuFigure:
    attributes: tuple[str, ...]
    v1: str
    v2: str
    checked: str


_BARE = "scripts/gpu-check-bare (not yet run on a GPU)"
FIGURES: tuple[GpuFigure, ...] = (
    GpuFigure((semconv.ATTR_GRAPH_FULL_COUNT, semconv.ATTR_GRAPH_FULL_BATCH_SIZES,
               semconv.ATTR_GRAPH_PIECEWISE_COUNT, semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES),
              "per _capture_cudagraphs call: its mode and batch descriptors",
              "per shape: CudaGraphManager.capture asks create_forward_fn(desc, warmup=True)",
              "tests/test_graph_capture.py (vLLM's real capture paths, piecewise-only, "
              f"full-only, full-and-piecewise); {_BARE}: the graphs it captured"),
    GpuFigure((semconv.ATTR_GRAPH_PIECEWISE_PIECES, semconv.ATTR_GRAPH_COUNT),
              "vLLM's compilation_counter.num_cudagraph_captured around each call",
              "the same counter, per shape; the total around capture_model",
              f"tests/test_graph_capture.py (real CUDAGraphWrapper pieces); {_BARE}"),
    GpuFigure((semconv.ATTR_GRAPH_MEMORY_BYTES, semconv.ATTR_GRAPH_FULL_MEMORY_BYTES,
               semconv.ATTR_GRAPH_PIECEWISE_MEMORY_BYTES),
              "the driver's used memory (cudaMemGetInfo) around each call",
              "total: capture_model's return (vLLM's 'took X GiB'); per mode: the driver "
              "around each shape",
              f"{_BARE}: driver around the capture, allocator reserved, per-mode driver"),
    GpuFigure((semconv.ATTR_STEP_CUDAGRAPH_MODE, semconv.ATTR_STEP_CUDAGRAPH_PADDED_TOKENS,
               semconv.ATTR_STEP_EXECUTION, semconv.ATTR_STEP_CUDAGRAPH_SOURCE),
              "CudagraphDispatcher.dispatch for the step's tokens (the last, after DP "
              "agreement); vLLM's cudagraph_stats on the output when --cudagraph-metrics",
              "CudaGraphManager.dispatch for the step's tokens (the last, after DP agreement); "
              "vLLM's cudagraph_stats on the output when --cudagraph-metrics",
              "tests/test_graph_dispatch.py (every mode, DP re-dispatch, KV-sharing dispatch, "
              f"cudagraph_stats); {_BARE}: what the step ran, set_sync_debug_mode"),
    GpuFigure((semconv.ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS, semconv.ATTR_CUDAGRAPH_MAX_FULL_TOKENS,
               semconv.ATTR_CUDAGRAPH_MAX_PIECEWISE_TOKENS),
              "the dispatcher's cudagraph_keys per mode (uniform keys: decode only)",
              "full: the captured graphs (captured_token_counts, graphs); piecewise: the "
              "capture sizes when piecewise runs mixed batches",
              f"tests/test_graph_dispatch.py; {_BARE}"),
    GpuFigure((semconv.ATTR_COMPILE_COMPILER, semconv.ATTR_COMPILE_FRAME),
              "torch.compile: Dynamo's start/end callbacks (batched_count_greater_than)",
              "Triton: triton.knobs.runtime.jit_cache_hook / jit_post_compile_hook (the "
              "logprobs kernels), chained with vLLM's JIT monitor; torch.compile as on V1",
              "tests/test_triton_compiles.py (a real Triton compile on CPU); "
              f"tests/test_gpu_paths.py (Dynamo); {_BARE}; scripts/gpu-check part 5"),
)


def rows(v2: bool) -> list[dict[str, str]]:
    """The figures as measured on one runner, for doctor's report."""
    return [{"attributes": ", ".join(f.attributes), "measured": f.v2 if v2 else f.v1,
             "checked": f.checked} for f in FIGURES]


def render(v2: bool) -> list[str]:
    lines = [f"GPU figures on {'Model Runner V2' if v2 else 'V1'} (docs/gpu-checks.md):"]
    for row in rows(v2):
        lines += [f"  {row['attributes']}", f"    measured: {row['measured']}",
                  f"    checked: {row['checked']}"]
    return lines
