"""Worker side: a Triton kernel compiled inside a step, timed through Triton's own public hooks.

Model Runner V2 computes logprobs (and other sampling steps) with ``@triton.jit`` kernels, not
with torch.compile: the first request that needs one pays Triton's compile (source to PTX to
cubin, a fraction of a second to seconds) inside its step, and Dynamo's callbacks see nothing.
Triton calls ``triton.knobs.runtime.jit_cache_hook`` right before it compiles a kernel for a new
specialization and ``jit_post_compile_hook`` right after (its documented knobs: "jit_cache_hook
will always be called before compilation and jit_post_compile_hook after"); a cached kernel
calls neither. vLLM's own JIT monitor (``vllm.utils.jit_monitor``, active after warm-up) sets the
post hook the same way, chaining to whatever was there: so do we, both ways, and on close we put
the previous hooks back where ours are still the installed ones (else ours stand aside).

A compile that runs inside a Dynamo compile (Inductor's kernels) is part of that compile and is
not noted twice. Triton's asynchronous compile mode ends a compile on another thread: there the
start is not ours to pair, and nothing is noted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def _frame(fn: Any) -> str:
    """``file.py:kernel``, the shape of Dynamo's frames (``module`` is the kernel's module)."""
    module = str(getattr(fn, "module", "") or "")
    return f"{module.rpartition('.')[2]}.py:{getattr(fn, 'name', '?')}"


class TritonCompiles:
    """Triton's JIT hooks, ours chained in front of the ones installed before. ``on_compile(start,
    end, frame, attempt)`` gets each compile on the compiling thread."""

    def __init__(self, on_compile: Callable[[float, float, str, int], None]) -> None:
        self.on_compile = on_compile
        self.knobs: Any = None  # triton.knobs.runtime while installed
        self.previous: tuple[Any, Any] = (None, None)
        self.started = threading.local()
        self.attempts: dict[str, int] = {}
        self.active = False

    def install(self) -> bool:
        try:
            from triton import knobs
        except ImportError:  # no Triton: nothing compiles Triton kernels
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook") \
                or not hasattr(runtime, "jit_cache_hook"):
            return False  # a Triton without these knobs
        self.previous = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        runtime.jit_cache_hook = self._before
        runtime.jit_post_compile_hook = self._after
        self.knobs, self.active = runtime, True
        return True

    def remove(self) -> None:
        runtime, self.knobs, self.active = self.knobs, None, False
        if runtime is None:
            return
        before, after = self.previous
        if runtime.jit_cache_hook == self._before:
            runtime.jit_cache_hook = before
        if runtime.jit_post_compile_hook == self._after:
            runtime.jit_post_compile_hook = after

    def _before(self, **kwargs: Any) -> Any:
        """Triton is about to compile (a truthy answer from a hook skips the compile: only the
        previous hook's answer is passed on)."""
        if self.active:
            self.started.at = time.monotonic()
        previous = self.previous[0]
        return previous(**kwargs) if previous is not None else None

    def _after(self, **kwargs: Any) -> Any:
        """Triton compiled; the previous hook (vLLM's JIT monitor, say) runs after our note."""
        start = getattr(self.started, "at", None)
        self.started.at = None
        if self.active and start is not None:
            frame = _frame(kwargs.get("fn"))
            attempt = self.attempts.get(frame, 0)
            if len(self.attempts) < 4096:
                self.attempts[frame] = attempt + 1
            self.on_compile(start, time.monotonic(), frame, attempt)
        previous = self.previous[1]
        return previous(**kwargs) if previous is not None else None
