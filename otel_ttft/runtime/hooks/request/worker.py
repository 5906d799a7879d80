"""Worker side of the request path: warm-up paid inside a step (a LoRA adapter loaded lazily, a
torch.compile that start-up skipped, e.g. ``VLLM_CPU_CI_ENV=1``) is timed here and handed to
EngineCore with the step's output: as an attribute of the next pickled ``ModelRunnerOutput``
(multiproc executor), or in-process with one worker. ``engine`` charges it to the requests that
were waiting for their first token when it started.

Compiles are timed by the one ``monitor_torch_compile`` wrapper (``hooks.warmup``), which calls
:func:`note_compile`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

WARMUP_ATTR = "_otel_ttft_warmup"
ADAPTER, COMPILE = "a", "c"

# (ADAPTER|COMPILE, lora_int_id, start, end) timed in this process, not yet shipped
pending: list[tuple[str, int, float, float]] = []


def _note(kind: str, lora_id: int, start: float) -> None:
    pending.append((kind, lora_id, start, time.monotonic()))
    del pending[:-64]


def note_compile(start: float) -> None:
    """A compile inside a step ran from ``start`` until now."""
    _note(COMPILE, 0, start)


def take_local() -> list[tuple[str, int, float, float]] | None:
    """What is pending, taken (uniproc executor: EngineCore reads it in-process)."""
    if not pending:
        return None
    events = pending[:]
    del pending[:len(events)]  # an append from another thread in between stays queued
    return events


def wrap_load_adapter(call: Callable[..., Any], instance: Any, args: tuple,
                      kwargs: dict) -> Any:
    start = time.monotonic()
    result = call(*args, **kwargs)
    lora_request = args[0] if args else kwargs["lora_request"]
    _note(ADAPTER, lora_request.lora_int_id, start)
    return result


def _attach(output: Any) -> Any:
    if hasattr(output, "req_id_to_index"):  # a ModelRunnerOutput: pickled to EngineCore
        events = take_local()
        if events:
            setattr(output, WARMUP_ATTR, events)
    return output


class _ResolveAndAttach:
    """Stands in for an ``AsyncModelRunnerOutput.get_output``: vLLM resolves the output itself
    (and handles its failure its own way, e.g. 0.33's ``FAILURE_WITH_KV_OUTPUT``); a resolved
    output gets the pending times."""

    __slots__ = ("get_output",)

    def __init__(self, get_output: Callable[[], Any]):
        self.get_output = get_output

    def __call__(self) -> Any:
        return _attach(self.get_output())


def wrap_enqueue_output(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``WorkerProc.enqueue_output``: attach pending warm-up times to the step's output."""
    if pending:
        output = args[0] if args else kwargs["output"]
        if hasattr(output, "get_output"):  # AsyncModelRunnerOutput: resolved inside vLLM's call
            output.get_output = _ResolveAndAttach(output.get_output)
        else:
            _attach(output)
    return call(*args, **kwargs)
