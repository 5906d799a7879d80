"""Trace contexts handed between vLLM's processes: the one a child was spawned with
(``env_parent_context``), and one the API process hands its EngineCore for calls that carry none.

vLLM's utility calls (``wake_up``) cross ZMQ without trace headers. EngineCore is a child of the
API process on the same host, so the API process leaves the caller's traceparent in a small file
named by its own pid for the length of the call, and EngineCore looks for its parent's. No file (a
remote or differently launched engine): EngineCore starts a trace of its own, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_ttft.runtime import state_files


def _path(api_pid: int, what: str) -> Path:
    return state_files.state_dir() / f"otel-ttft-{api_pid}-{what}.json"


@contextlib.contextmanager
def offered(what: str) -> Iterator[None]:
    """API side: the current context is available to our EngineCore while the block runs."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    path: Path | None = _path(os.getpid(), what)
    try:
        state_files.write_atomic(path, carrier)
    except OSError:
        path = None
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def taken(what: str) -> otel_context.Context | None:
    """EngineCore side: the context our parent (the API process) offered, if any."""
    carrier = state_files.read_json(_path(os.getppid(), what))
    return TraceContextTextMapPropagator().extract(carrier) if carrier else None


def _initial_environ() -> dict[str, str]:
    """The environment this process was exec'd with.

    vLLM's ``propagate_trace_to_env`` rewrites ``os.environ["traceparent"]`` around each of its
    spans, so by the time a plugin loads, os.environ names a span of this very process.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def env_parent_context() -> otel_context.Context | None:
    """The traceparent the parent process handed us at spawn (vLLM passes it in the env)."""
    env = _initial_environ()
    carrier = {k: v for k in ("traceparent", "tracestate")
               if (v := env.get(k) or env.get(k.upper()))}
    return TraceContextTextMapPropagator().extract(carrier) if carrier else None
