"""The caller's trace, in the API process: ``request.caller`` notes the ``trace_headers`` a
request came with before vLLM drops them (it keeps them only for its own tracing), and
``request.caller_server`` tells it, in vLLM's server, when a request carries any at all."""

from __future__ import annotations

import time
import weakref
from typing import Any

from otel_ttft.runtime.hooks.registry import PASS, Hook, Split, bypass, restore, working
from otel_ttft.runtime.hooks.request import state
from otel_ttft.runtime.hooks.request.state import CALLER_HEADERS
from otel_ttft.semconv import PROCESS_API_SERVER as API_SERVER


def before_engine_add_request(instance: Any, args: tuple, kwargs: dict) -> Any:
    """Notes the caller's ``trace_headers`` before vLLM drops them (it keeps them only for its
    own tracing), ahead of the call: no extra coroutine. ``generate`` awaits the call in the task
    that then runs ``OutputProcessor.add_request``, where the record reads them.

    In vLLM's server, an untraced call also sends this ``AsyncLLM`` to vLLM's own method
    (``registry.bypass``) while no traced request is on its way (``after_server_trace_headers``
    counts them): this hook cost every request about 4 us, and most requests of most servers
    carry no trace headers. Headers nobody announced mean a caller of its own (a program
    embedding ``AsyncLLM``): the hook then stays on every call."""
    headers = kwargs.get("trace_headers", args[6] if len(args) > 6 else None)
    if headers:
        state.caller_headers_seen = True
        CALLER_HEADERS.set(headers)
        if state.caller_headers_due:
            state.caller_headers_due -= 1
        else:
            state.caller_headers_direct = True
        return PASS
    if state.caller_headers_seen and CALLER_HEADERS.get() is not None:
        CALLER_HEADERS.set(None)  # an untraced request after a traced one in this task
    if state.caller_headers_direct or not working(SERVER_HEADERS_HOOK_NAME):
        return PASS
    if state.caller_headers_due:
        if time.monotonic() - state.caller_headers_due_at < CALLER_HEADERS_DUE_S:
            return PASS
        state.caller_headers_due = 0  # announced, never added (refused, or the client left)
    bypass(instance, "add_request")
    _untraced_engines.add(instance)
    return PASS


wrap_engine_add_request = Split(before_engine_add_request)
_untraced_engines: weakref.WeakSet[Any] = weakref.WeakSet()
"""The ``AsyncLLM`` objects calling vLLM's own ``add_request`` (``before_engine_add_request``)."""
CALLER_HEADERS_DUE_S = 60.0
"""How long a traced request announced by the server may take to reach ``add_request`` (its
prompt is rendered and tokenized in between) before the count forgets it."""


def after_server_trace_headers(token: Any, instance: Any, args: tuple, kwargs: dict,
                               result: Any) -> None:
    """vLLM's server found trace headers on a request (it calls ``extract_trace_headers`` only
    then, in ``BaseServing._get_trace_headers``, ahead of ``generate``): counted, and the
    ``AsyncLLM`` objects that skip ``before_engine_add_request`` take it again, so that this
    request's ``add_request`` passes through it. The headers are read there, in the task that
    calls ``generate`` (vLLM's server runs the handler in a task of its own: a context variable
    set here would not reach it)."""
    if result:
        state.caller_headers_due += 1
        state.caller_headers_due_at = time.monotonic()
        if _untraced_engines:
            for engine in list(_untraced_engines):
                restore(engine, "add_request")
            _untraced_engines.clear()


wrap_server_trace_headers = Split(after=after_server_trace_headers)


SERVER_HEADERS_HOOK_NAME = "request.caller_server"
SERVER_HEADERS_HOOK = Hook(SERVER_HEADERS_HOOK_NAME,
                           "vllm.entrypoints.serve.engine.serving:extract_trace_headers",
                           wrap_server_trace_headers, process=API_SERVER, optional=True)
