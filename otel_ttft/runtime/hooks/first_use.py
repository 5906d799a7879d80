"""First use in the API process: the caches vLLM's front end fills on the first request after an
activation, timed where they are filled.

The article counts "tokenizer and prompt-template caches on the first request after activation"
as runtime initialization, not front-end work. In vLLM 0.32 the first chat request of a process
scans every installed distribution's entry points for logits-processor plugins (20-40 ms on the
machines here, against 0.3 ms for the same step later) and compiles any chat template not
compiled yet. Both sit behind a ``functools.lru_cache`` whose miss calls a module-level
function by name (``_load_logitsprocs_plugins``, ``_cached_compile_jinja_template``): those are
wrapped here, so a call is a fill and a cache hit costs nothing. The same request also loads
modules the server never needed before (anyio's sockets, dataclasses built on import: 15-50 ms
there); a module load is the import system's ``_load_unlocked``, which runs only for a module
not yet in ``sys.modules``, so it is timed too (the outermost load of a nest, API process only).
Each fill's interval is kept (a bounded ring, any thread: the template renders in vLLM's
executor thread); the request span then names the fills inside its front end
``warmup.first_use`` (``spans``), carved out of ``frontend`` the way a compile inside Prefill is
carved out of ``prefill``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime.hooks.registry import Hook

API_SERVER = semconv.PROCESS_API_SERVER
Fill = tuple[float, float, str]  # monotonic start, end, which cache
IMPORTS = "lazy module imports"


class FirstUse:
    """The ``first_use`` part: the fills seen so far (``fills``: a bounded ring, appended from
    any thread; appends are atomic, no lock) and each thread's depth of nested module loads;
    ``identity``: the process's (only the API server records)."""

    def __init__(self, process_state: Any) -> None:
        self.identity = process_state.identity
        self.fills: deque[Fill] = deque(maxlen=256)
        self.nesting = threading.local()

    def within(self, start: float, end: float) -> list[Fill]:
        """The fills that began inside ``[start, end]``, in time order. Fills are kept in the
        order they ended, so when the newest ended before ``start`` there is none: the common
        case, one comparison per request."""
        fills = self.fills
        if not fills or fills[-1][1] < start:
            return []
        return sorted(f for f in list(fills) if start <= f[0] <= end)


PART = "first_use"

def _filler(label: str) -> Callable[..., Any]:
    def wrapper(part: FirstUse, call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        start = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            part.fills.append((start, time.monotonic(), label))
    return wrapper


def wrap_module_load(part: FirstUse, call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """A module loaded for the first time: in the API process, the outermost load of a nest is a
    fill (the modules it imports are part of it)."""
    if part.identity.kind != API_SERVER:
        return call(*args, **kwargs)
    nesting = part.nesting
    depth = getattr(nesting, "depth", 0)
    nesting.depth = depth + 1
    start = time.monotonic()
    try:
        return call(*args, **kwargs)
    finally:
        nesting.depth = depth
        if depth == 0:
            part.fills.append((start, time.monotonic(), IMPORTS))


# (hook name, target, what the cache holds): what runs when a first request's cache misses, in
# vLLM 0.32 and its transformers; each is called only on a miss of the lru_cache around it.
_CACHES = (
    ("request.first_use.logits_processors",
     "vllm.v1.sample.logits_processor:_load_logitsprocs_plugins",
     "logits-processor plugins (entry-point scan)"),
    ("request.first_use.chat_template",
     "transformers.utils.chat_template_utils:_cached_compile_jinja_template",
     "chat template compile"),
)
HOOKS = [*(Hook(name, target, _filler(label), stage=semconv.STAGE_WARMUP_FIRST_USE,
                process=API_SERVER, optional=True, state=PART)
           for name, target, label in _CACHES),
         Hook("request.first_use.imports", "importlib._bootstrap:_load_unlocked",
              wrap_module_load, stage=semconv.STAGE_WARMUP_FIRST_USE, process=API_SERVER,
              state=PART)]
