"""The CUDA work of the bare GPU check, shaped as vLLM 0.33 does it, without vLLM.

- A decoder-shaped stack split into *pieces* at its attention ops, as vLLM's compiled model is:
  a **piecewise** capture of one batch size captures every piece into a CUDA graph of its own
  (``CUDAGraphWrapper`` per piece, the attention between them eager); a **full** capture holds
  the whole forward in one graph. Every graph goes into one shared pool, largest first, with gc
  held off; each capture bumps the stand-in of vLLM's ``compilation_counter``, as vLLM's code
  does. :class:`Captured` is the script's own record of every graph it captured (the reference).
- The KV cache as vLLM has allocated it since 0.32: one backing allocation shared by every
  KV-cache group, each group's ``KVCacheTensor`` giving that allocation's size.
- Safetensors shards read as vLLM's default loader reads them (``safe_open``, ``get_tensor``:
  memory-mapped, the disk read faulting in during the copy to the device).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock


class CUDAGraphMode:
    """``vllm.config.CUDAGraphMode``'s members the check uses, with its methods."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __bool__(self) -> bool:
        return self.name != "NONE"

    def mixed_mode(self) -> CUDAGraphMode:
        return PIECEWISE if self.name in ("PIECEWISE", "FULL_AND_PIECEWISE") else \
            (FULL if self.name == "FULL" else NONE)


NONE, PIECEWISE, FULL = CUDAGraphMode("NONE"), CUDAGraphMode("PIECEWISE"), CUDAGraphMode("FULL")
FULL_AND_PIECEWISE = CUDAGraphMode("FULL_AND_PIECEWISE")


@dataclass
class CompilationCounter:
    """``vllm.compilation.counter.compilation_counter``: CUDA graphs captured."""

    num_cudagraph_captured: int = 0


@dataclass(frozen=True)
class BatchDescriptor:
    """``vllm.forward_context.BatchDescriptor`` (V1's capture key)."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """``vllm.v1.worker.gpu.cudagraph_utils.BatchExecutionDescriptor`` (V2's)."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0


@dataclass
class CUDAGraphStat:
    """``vllm.compilation.cuda_graph.CUDAGraphStat``: vLLM's per-step record."""

    num_unpadded_tokens: int
    num_padded_tokens: int
    num_paddings: int
    runtime_mode: str


@dataclass
class Captured:
    """What the script captured, by mode: the reference the span is judged against."""

    sizes: dict[str, list[int]] = field(default_factory=lambda: {"FULL": [], "PIECEWISE": []})
    graphs: dict[str, int] = field(default_factory=lambda: {"FULL": 0, "PIECEWISE": 0})
    memory: dict[str, int] = field(default_factory=lambda: {"FULL": 0, "PIECEWISE": 0})


@contextlib.contextmanager
def quiet_capture(torch: Any) -> Iterator[None]:
    """As ``CUDAGraphWrapper`` with ``gc_disable``: no gc and no cache emptying per graph."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(gc, "collect", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(torch.cuda, "empty_cache", lambda *a, **k: None))
        yield


class PiecewiseModel:
    """``layers`` pieces (up, SiLU, down, residual: GEMMs whose activations land in the pool),
    an eager "attention" (a scale) between them; static input buffers, one per piece."""

    def __init__(self, torch: Any, hidden: int, layers: int, max_tokens: int,
                 counter: CompilationCounter) -> None:
        self.torch, self.counter = torch, counter
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.weights = [
            (torch.randn(4 * hidden, hidden, device="cuda", dtype=torch.bfloat16,
                         generator=gen) * 0.02,
             torch.randn(hidden, 4 * hidden, device="cuda", dtype=torch.bfloat16,
                         generator=gen) * 0.02) for _ in range(layers)]
        self.inputs = [torch.zeros(max_tokens, hidden, device="cuda", dtype=torch.bfloat16)
                       for _ in range(layers)]
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()  # vLLM's graph_capture(): warm-ups and captures on one
        self.pieces: dict[int, list[tuple[Any, Any]]] = {}  # tokens -> (graph, output) per piece
        self.full: dict[int, tuple[Any, Any]] = {}  # tokens -> (graph, output)
        self.captured = Captured()

    def _piece(self, i: int, x: Any) -> Any:
        up, down = self.weights[i]
        f = self.torch.nn.functional
        return x + f.silu(x @ up.t()) @ down.t()

    @staticmethod
    def _attention(x: Any) -> Any:
        return x * 0.5

    def eager(self, n: int) -> Any:
        x = self.inputs[0][:n]
        for i in range(len(self.weights)):
            x = self._attention(self._piece(i, x))
        return x

    def _graph(self, fn: Any) -> tuple[Any, Any]:
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        with quiet_capture(torch), torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            output = fn()
        self.counter.num_cudagraph_captured += 1
        return graph, output

    def capture(self, mode: str, n: int) -> None:
        """One batch size in ``mode``: a warm-up run, then the capture(s), on the capture stream;
        the driver's reading around both (as vLLM's own and ours are)."""
        torch = self.torch
        torch.cuda.synchronize()
        used = _used(torch)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self._capture(mode, n)
        torch.cuda.current_stream().wait_stream(self.stream)
        torch.cuda.synchronize()
        self.captured.memory[mode] += max(_used(torch) - used, 0)

    def _capture(self, mode: str, n: int) -> None:
        torch = self.torch
        self.eager(n)
        torch.cuda.synchronize()
        if mode == "FULL":
            self.full[n] = self._graph(lambda: self.eager(n))
            graphs = 1
        else:
            graphs, self.pieces[n] = len(self.weights), []
            for i in range(len(self.weights)):
                self.pieces[n].append(self._graph(lambda i=i: self._piece(i, self.inputs[i][:n])))
        self.captured.sizes[mode].append(n)
        self.captured.graphs[mode] += graphs

    def replay(self, mode: str, n: int) -> Any:
        """A step of ``n`` tokens (the input already in ``inputs[0]``): no host sync."""
        if mode == "FULL":
            graph, output = self.full[n]
            graph.replay()
            return output
        x = None
        for i, (graph, output) in enumerate(self.pieces[n]):
            if i:
                self.inputs[i][:n].copy_(self._attention(x))
            graph.replay()
            x = output
        return self._attention(x)


def _used(torch: Any) -> int:
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


# --- KV cache: one backing allocation, two groups (vLLM >= 0.32) -------------------------------

@dataclass
class KVCacheTensor:
    """``vllm.v1.kv_cache_interface.KVCacheTensor``."""

    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)


def hybrid_kv_config(num_blocks: int, block_size: int, page_bytes: int, layers: int
                     ) -> KVCacheConfig:
    """Sliding-window and full-attention layers alternating (Gemma 2/3, gpt-oss): two groups
    overlaying one block-outermost allocation of ``num_blocks`` blocks; each group's tensor
    names the whole allocation's size, as vLLM's planner writes it."""
    sliding = [f"model.layers.{i}.self_attn.attn" for i in range(0, layers, 2)]
    full = [f"model.layers.{i}.self_attn.attn" for i in range(1, layers, 2)]
    per_block = page_bytes * max(len(sliding), len(full))
    size = num_blocks * per_block
    tensors = [KVCacheTensor(size, names, page_bytes, per_block) for names in (sliding, full)]
    groups = [KVCacheGroupSpec(names, SimpleNamespace(block_size=block_size,
                                                      page_size_bytes=page_bytes,
                                                      sliding_window=window))
              for names, window in ((sliding, 4096), (full, None))]
    return KVCacheConfig(num_blocks, tensors, groups)


def allocate_kv(torch: Any, config: KVCacheConfig, device: str) -> dict[str, Any]:
    """As vLLM's worker: one buffer per distinct backing allocation, every layer a view."""
    backing = torch.zeros(max(t.size for t in config.kv_cache_tensors), dtype=torch.int8,
                          device=device)
    views = {}
    for t in config.kv_cache_tensors:
        for index, name in enumerate(t.layers):
            views[name] = backing[t.offset + index * t.layer_stride:][:t.block_stride]
    return views
