"""Worker side, GPU: the CUDA-graph decision vLLM made for a step that starts some request's
prefill. vLLM captures graphs at start-up for batches up to a size; a step outside them (more
tokens than the largest, or a shape no graph was captured for) runs eager, which on a GPU costs
kernel-launch time a captured graph would not. The decision is what
``CudagraphDispatcher.dispatch`` (V1) or ``CudaGraphManager.dispatch`` (Model Runner V2)
returns; the first one of a step is noted for the step's new requests, with the step's tokens
and the largest captured batch, on the worker's part (``worker.WorkerSteps.note_graph``), and
rides to EngineCore with the worker's other notes.

Evidence, not a timed stage: the eager step's time is the request's prefill, and what a graph
would have saved is not measured. Nothing is noted while no graph is captured (CPU, eager
servers) or the step starts no prefill: one truth test per dispatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_ttft.runtime.hooks.request.payload import GraphChoice
from otel_ttft.runtime.hooks.request.worker import WorkerSteps


def _choice(mode: Any, tokens: int, max_captured: int) -> GraphChoice:
    return GraphChoice(getattr(mode, "name", str(mode)), int(tokens), int(max_captured))


def wrap_dispatch_v1(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """``CudagraphDispatcher.dispatch(num_tokens, ...) -> (mode, BatchDescriptor)``."""
    result = call(*args, **kwargs)
    step = part.unnoted_prefill_step()
    if step is not None and instance.keys_initialized \
            and instance.cudagraph_mode.name != "NONE":
        tokens = args[0] if args else kwargs["num_tokens"]
        largest = instance.compilation_config.max_cudagraph_capture_size
        part.note_graph(step, _choice(result[0], tokens, largest or 0))
    return result


def wrap_dispatch_v2(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """Model Runner V2's ``CudaGraphManager.dispatch(num_reqs, num_tokens, ...) ->
    BatchExecutionDescriptor``."""
    result = call(*args, **kwargs)
    step = part.unnoted_prefill_step()
    sizes = instance.captured_token_counts() if step is not None else ()
    if sizes:
        tokens = args[1] if len(args) > 1 else kwargs["num_tokens"]
        part.note_graph(step, _choice(result.cg_mode, tokens, sizes[-1]))
    return result
