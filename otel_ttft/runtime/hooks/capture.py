"""CUDA-graph capture, full and piecewise counted apart, on V1 and Model Runner V2.

vLLM captures two kinds of graph. A *full* graph holds a whole forward pass for one batch shape:
one CUDA graph. A *piecewise* capture runs the torch.compiled model, whose pieces between the
attention layers are each captured by their own ``CUDAGraphWrapper``: one batch shape makes a
CUDA graph per piece (about one per layer). vLLM's ``compilation_counter.num_cudagraph_captured``
rises once per CUDA graph, so it counts pieces; the shapes are what a reader means by "graphs
captured for batch sizes ...". Each capture is noted with its mode, its size, the counter's rise
and the driver's used memory around it (:class:`GraphTally`, on the warm-up part while the
"Capture model" span is open), and the span gets both modes apart.

Where each capture is seen:

- V1 (``gpu_model_runner.GPUModelRunner._capture_cudagraphs(batch_descriptors,
  cudagraph_runtime_mode)``): one call per mode, under vLLM's own "Capture model" span; vLLM
  synchronises after every shape, so the memory readings around a call are the call's.
- V2 (``gpu.cudagraph_utils.CudaGraphManager.capture(create_forward_fn, ...)``, inside our
  "Capture model" span around ``capture_model``): one call for every mode; it asks
  ``create_forward_fn(desc, warmup=True)`` once per shape, before that shape's warm-up and
  capture, so the wrapper hands vLLM a forwarding function that notes ``desc`` (its ``cg_mode``
  and ``num_tokens``) and closes the previous shape's reading. The memory of a shape is read
  outside its ``torch.cuda.graph`` block (``create_forward_fn`` prepares inputs outside it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks import runners
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_WORKER as WORKER

FULL, PIECEWISE = "FULL", "PIECEWISE"


def compilation_counter():
    """vLLM's compilation counter (the device check answers this one question for vLLM)."""
    from vllm.compilation.counter import compilation_counter as counter

    return counter


def device_memory_used() -> int | None:
    """The driver's used device memory (``cudaMemGetInfo``: no device synchronisation)."""
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            return int(total - free)
    except Exception:  # noqa: BLE001 - a probe must never fail the capture
        return None
    return None


@dataclass
class _Open:
    mode: str
    graphs_at: int
    memory_at: int | None


@dataclass
class GraphTally:
    """The captures of one "Capture model" span, per mode."""

    span_id: int = 0
    sizes: dict[str, list[int]] = field(default_factory=lambda: {FULL: [], PIECEWISE: []})
    graphs: dict[str, int] = field(default_factory=lambda: {FULL: 0, PIECEWISE: 0})
    memory: dict[str, int | None] = field(default_factory=lambda: {FULL: None, PIECEWISE: None})
    open: _Open | None = None

    def begin(self, mode: str, tokens: int) -> None:
        """A shape of ``mode`` starts (its warm-up, then its capture)."""
        self.end()
        if mode not in self.sizes:  # NONE or a mode vLLM adds later: not a graph of ours
            return
        self.sizes[mode].append(int(tokens))
        self.open = _Open(mode, compilation_counter().num_cudagraph_captured, device_memory_used())

    def end(self) -> None:
        """The open shape is done: its CUDA graphs and memory go to its mode."""
        shape, self.open = self.open, None
        if shape is None:
            return
        self.graphs[shape.mode] += compilation_counter().num_cudagraph_captured - shape.graphs_at
        self.add_memory(shape.mode, shape.memory_at, device_memory_used())

    def add_memory(self, mode: str, before: int | None, after: int | None) -> None:
        if before is not None and after is not None:
            self.memory[mode] = (self.memory[mode] or 0) + max(after - before, 0)

    def attributes(self) -> dict[str, Any]:
        self.end()
        full, piecewise = (sorted(set(self.sizes[m]), reverse=True) for m in (FULL, PIECEWISE))
        attrs: dict[str, Any] = {
            semconv.ATTR_GRAPH_COUNT: self.graphs[FULL] + self.graphs[PIECEWISE],
            semconv.ATTR_GRAPH_BATCH_SIZES: sorted({*full, *piecewise}, reverse=True),
            semconv.ATTR_GRAPH_FULL_COUNT: len(full),
            semconv.ATTR_GRAPH_FULL_BATCH_SIZES: full,
            semconv.ATTR_GRAPH_PIECEWISE_COUNT: len(piecewise),
            semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES: piecewise,
            semconv.ATTR_GRAPH_PIECEWISE_PIECES: self.graphs[PIECEWISE],
        }
        for mode, key in ((FULL, semconv.ATTR_GRAPH_FULL_MEMORY_BYTES),
                          (PIECEWISE, semconv.ATTR_GRAPH_PIECEWISE_MEMORY_BYTES)):
            if self.memory[mode] is not None:
                attrs[key] = self.memory[mode]
        return attrs

    @property
    def seen(self) -> bool:
        return bool(self.sizes[FULL] or self.sizes[PIECEWISE])


def _mode_name(mode: Any) -> str:
    return getattr(mode, "name", str(mode))


def wrap_capture_cudagraphs_v1(warmup: Any, call, instance, args, kwargs):
    """V1's ``_capture_cudagraphs(batch_descriptors, cudagraph_runtime_mode)``: one mode per
    call, inside vLLM's "Capture model"; each call adds to that span's tally."""
    span = trace.get_current_span()
    if not span.is_recording():
        return call(*args, **kwargs)
    span_id = span.get_span_context().span_id
    tally = warmup.graphs
    if tally is None or tally.span_id != span_id:
        tally = warmup.graphs = GraphTally(span_id)
    descriptors = list(args[0] if args else kwargs.get("batch_descriptors") or [])
    mode = _mode_name(args[1] if len(args) > 1 else kwargs.get("cudagraph_runtime_mode"))
    before, memory_before = compilation_counter().num_cudagraph_captured, device_memory_used()
    result = call(*args, **kwargs)
    if mode in tally.sizes:
        tally.sizes[mode] += [int(getattr(d, "num_tokens", 0)) for d in descriptors]
        tally.graphs[mode] += compilation_counter().num_cudagraph_captured - before
        tally.add_memory(mode, memory_before, device_memory_used())
    attrs = tally.attributes()
    used = [tally.memory[m] for m in (FULL, PIECEWISE) if tally.memory[m] is not None]
    if used:
        attrs[semconv.ATTR_GRAPH_MEMORY_BYTES] = sum(used)
    span.set_attributes({**attrs, **runners.runner_attributes(instance)})
    span.set_attribute(semconv.ATTR_STAGE, semconv.STAGE_WARMUP_GRAPH_CAPTURE)
    return result


def wrap_manager_capture(warmup: Any, call, instance, args, kwargs):
    """V2's ``CudaGraphManager.capture(create_forward_fn, ...)``: inside our "Capture model"
    (``runners``), each shape is noted when vLLM asks for its warm-up forward. Outside it (the
    profiling estimate, ``capture_model(profile_only=True)``) nothing is noted."""
    tally = warmup.graphs
    if tally is None:
        return call(*args, **kwargs)
    create = args[0] if args else kwargs["create_forward_fn"]

    def noting(desc: Any, warmup: bool) -> Any:
        if warmup:
            tally.begin(_mode_name(desc.cg_mode), desc.num_tokens)
        return create(desc, warmup)

    if args:
        args = (noting, *args[1:])
    else:
        kwargs = {**kwargs, "create_forward_fn": noting}
    try:
        return call(*args, **kwargs)
    finally:
        tally.end()


def wrap_capture_model(warmup: Any, call, instance, args, kwargs):
    """V2's ``capture_model`` (and the encoder-only runner's): no span of vLLM's around it, so
    ours, "Capture model" as on V1, with each mode's shapes (from the tally the manager's
    ``capture`` fills) and the bytes vLLM returns (its own "took X GiB" reading). Its
    ``profile_only`` calls (a memory estimate before the KV cache exists) are not the stage."""
    if kwargs.get("profile_only"):
        return call(*args, **kwargs)
    counter = compilation_counter()
    graphs_before = counter.num_cudagraph_captured
    with spans.stage_span(semconv.SPAN_GRAPH_CAPTURE, semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                          enrich=semconv.SPAN_GRAPH_CAPTURE,
                          attributes=runners.runner_attributes(instance),
                          tracer=warmup.tracer, identity=warmup.identity) as span:
        tally = warmup.graphs = GraphTally(span.get_span_context().span_id)
        try:
            graph_bytes = call(*args, **kwargs)
        finally:
            warmup.graphs = None
        attrs = tally.attributes()
        # graphs captured outside the manager (the encoder's, a drafter's own): the counter
        attrs[semconv.ATTR_GRAPH_COUNT] = counter.num_cudagraph_captured - graphs_before
        if isinstance(graph_bytes, int):
            attrs[semconv.ATTR_GRAPH_MEMORY_BYTES] = int(graph_bytes)
        span.set_attributes(attrs)
        return graph_bytes


GRAPH_CAPTURE = Hook(runners.GRAPHS_V1, f"{runners.V1}._capture_cudagraphs",
                     wrap_capture_cudagraphs_v1, stage=semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                     process=WORKER, state="warmup")
GRAPH_CAPTURE_V2_SHAPES = Hook(runners.GRAPH_SHAPES_V2, f"{runners.V2_GRAPHS}.capture",
                               wrap_manager_capture, stage=semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                               process=WORKER, state="warmup")

GRAPH_CAPTURE_V2 = Hook(runners.GRAPHS_V2, f"{runners.V2}.capture_model", wrap_capture_model,
                        stage=semconv.STAGE_WARMUP_GRAPH_CAPTURE, process=WORKER, state="warmup")
GRAPH_CAPTURE_MM = Hook(runners.GRAPHS_MM, f"{runners.MM_ENCODER}.capture_model",
                        wrap_capture_model, stage=semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                        process=WORKER, state="warmup")

HOOKS = [GRAPH_CAPTURE, GRAPH_CAPTURE_V2, GRAPH_CAPTURE_MM, GRAPH_CAPTURE_V2_SHAPES]
