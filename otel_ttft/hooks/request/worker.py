"""Worker side of the request path: warm-up paid inside a step (a LoRA adapter loaded lazily, a
torch.compile that start-up skipped) is timed here and handed to EngineCore with the step's
output (see ``engine`` for where it is charged)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("otel_ttft")

_WARMUP_ATTR = "_otel_ttft_warmup"
ADAPTER, COMPILE = "a", "c"

# (ADAPTER|COMPILE, lora_int_id, start, end) timed in this process (worker side), not yet shipped
_warmup: list[tuple[str, int, float, float]] = []
_failed_once: set[str] = set()


def _fail(where: str, exc: BaseException) -> None:
    if where not in _failed_once:
        _failed_once.add(where)
        logger.warning("otel-ttft request hook %s failed (skipped from now on): %r", where, exc,
                       exc_info=exc)


# --- worker: time warm-up paid inside a step, hand it to EngineCore with the step's output ------

def wrap_load_adapter(wrapped: Callable[..., Any], instance: Any, args: tuple,
                      kwargs: dict) -> Any:
    start = time.monotonic()
    result = wrapped(*args, **kwargs)
    try:
        lora_request = args[0] if args else kwargs["lora_request"]
        _note_warmup(ADAPTER, lora_request.lora_int_id, start)
    except Exception as exc:  # noqa: BLE001
        _fail("load_adapter", exc)
    return result


class _TimedCompile:
    """Wraps the context manager ``monitor_torch_compile`` returns; times what it brackets."""

    __slots__ = ("inner", "start")

    def __init__(self, inner: Any):
        self.inner, self.start = inner, 0.0

    def __enter__(self) -> Any:
        self.start = time.monotonic()
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            _note_warmup(COMPILE, 0, self.start)


def wrap_monitor_torch_compile(wrapped: Callable[..., Any], instance: Any, args: tuple,
                               kwargs: dict) -> Any:
    """Times compiles; not the AOT-cache load probe (``announce_start=False``), which a server
    whose warm-up was skipped repeats on every step without compiling anything."""
    if kwargs.get("announce_start") is False:
        return wrapped(*args, **kwargs)
    return _TimedCompile(wrapped(*args, **kwargs))


def _note_warmup(kind: str, lora_id: int, start: float) -> None:
    _warmup.append((kind, lora_id, start, time.monotonic()))
    del _warmup[:-64]


def _take_local_warmup() -> list[tuple[str, int, float, float]] | None:
    """Worker in this process (uniproc executor): no pickling in between."""
    if not _warmup:
        return None
    events = _warmup[:]
    del _warmup[:len(events)]  # an append from another thread in between stays queued
    return events


def wrap_enqueue_output(wrapped: Callable[..., Any], instance: Any, args: tuple,
                        kwargs: dict) -> Any:
    """WorkerProc.enqueue_output: attach pending warm-up times to a ModelRunnerOutput."""
    if not _warmup:
        return wrapped(*args, **kwargs)
    try:
        output = args[0] if args else kwargs["output"]
    except Exception:  # noqa: BLE001 - not the signature we know: leave it alone
        return wrapped(*args, **kwargs)
    if hasattr(output, "get_output"):  # AsyncModelRunnerOutput: resolve it as vLLM would
        try:
            output = output.get_output()
        except Exception as exc:  # noqa: BLE001 - vLLM turns this into a FAILURE response
            output = exc
    try:
        if hasattr(output, "req_id_to_index"):
            setattr(output, _WARMUP_ATTR, _take_local_warmup())
    except Exception as exc:  # noqa: BLE001
        _fail("enqueue_output", exc)
    return wrapped(output)
