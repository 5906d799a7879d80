"""Worker side, GPU: the CUDA-graph decision for a step that starts some request's prefill, in
every cudagraph mode. vLLM captures graphs at start-up: full graphs (one per batch shape) and
piecewise ones (the compiled model's pieces, per shape); a step outside them runs the compiled
model without a graph (``compiled``) or, with compilation off, eager. The decision is what
``CudagraphDispatcher.dispatch`` (V1) or ``CudaGraphManager.dispatch`` (Model Runner V2)
returns for the step's tokens; a dispatch for fewer tokens than the step holds (the logits-only
dispatch of KV-sharing models) is not the step's, and a later one for the step (the re-dispatch
after data-parallel ranks agreed on a padded size) replaces it. It is kept on the worker's part
(``worker.WorkerSteps.note_graph``) and shipped with the step's output, where vLLM's own
per-step record, ``cudagraph_stats`` (``--cudagraph-metrics``), says what ran, if present.

With it go the limits the decision was made against, each mode apart, read from the dispatcher
itself: V1's ``cudagraph_keys`` (per mode, ``uniform`` marking decode-only keys); V2's captured
full graphs (``graphs``, ``captured_token_counts()``) and, for piecewise, the capture sizes of
the config (V2 captures every size piecewise when piecewise graphs run mixed batches).

Evidence, not a timed stage. Nothing is noted while no graph is captured (CPU, eager servers) or
the step starts no prefill: one truth test per dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from otel_ttft.runtime.hooks.request.payload import GraphChoice
from otel_ttft.runtime.hooks.request.worker import WorkerSteps


def _name(mode: Any) -> str:
    return str(getattr(mode, "name", mode)).rpartition(".")[2]


def _compiled(compilation_config: Any) -> bool:
    return _name(getattr(compilation_config, "mode", "NONE")) != "NONE"


def _largest(tokens: Iterable[int]) -> int:
    return max((int(n) for n in tokens), default=0)


def _own_step(part: WorkerSteps, tokens: int) -> Any:
    """The step this dispatch decides, if it starts a prefill and the dispatch covers it."""
    step = part.prefill_step()
    if step is None or tokens < int(getattr(step, "total_num_scheduled_tokens", 0) or 0):
        return None
    return step


def wrap_dispatch_v1(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """``CudagraphDispatcher.dispatch(num_tokens, ...) -> (mode, BatchDescriptor)``."""
    result = call(*args, **kwargs)
    tokens = int(args[0] if args else kwargs["num_tokens"])
    step = _own_step(part, tokens)
    if step is None or not instance.keys_initialized or _name(instance.cudagraph_mode) == "NONE":
        return result
    keys = {_name(mode): descs for mode, descs in instance.cudagraph_keys.items()}
    mixed = _largest(d.num_tokens for descs in keys.values() for d in descs if not d.uniform)
    mode, descriptor = result
    part.note_graph(step, GraphChoice(
        _name(mode), tokens, mixed, int(descriptor.num_tokens),
        _largest(d.num_tokens for d in keys.get("FULL", ())),
        _largest(d.num_tokens for d in keys.get("PIECEWISE", ())),
        _compiled(instance.compilation_config)))
    return result


def wrap_dispatch_v2(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """Model Runner V2's ``CudaGraphManager.dispatch(num_reqs, num_tokens, ...) ->
    BatchExecutionDescriptor``."""
    result = call(*args, **kwargs)
    tokens = int(args[1] if len(args) > 1 else kwargs["num_tokens"])
    step = _own_step(part, tokens)
    mode = getattr(instance, "cudagraph_mode", None)
    if step is None or mode is None or _name(mode) == "NONE":
        return result
    config = instance.compilation_config
    piecewise = _largest(config.cudagraph_capture_sizes or ()) \
        if _name(mode.mixed_mode()) == "PIECEWISE" else 0
    full_mixed = _largest(d.num_tokens for d in instance.graphs
                          if getattr(d, "uniform_token_count", None) is None
                          and getattr(d, "max_query_len", None) is None
                          and not getattr(d, "num_active_loras", 0))
    part.note_graph(step, GraphChoice(
        _name(result.cg_mode), tokens, max(piecewise, full_mixed), int(result.num_tokens),
        _largest(instance.captured_token_counts()), piecewise, _compiled(config)))
    return result
