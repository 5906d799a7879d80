"""A child process that dies during an activation is reported by its parent's span.

EngineCore waits for its workers (``WorkerProc.wait_for_ready``) and the API server for EngineCore
(``wait_for_engine_startup``); when a child dies there, vLLM raises a generic "initialization
failed". The parent's open span then gets a ``child process died`` event (pid, exit code or
signal, the stage the child was in, from the chain the child published), the child's own open
spans are ended with an error on its behalf (a SIGKILL gave it no chance), and the trace's failed
stage is recorded so the activation root names it.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, inflight, state_files
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.semconv import PROCESS_API_SERVER as API_SERVER
from otel_ttft.semconv import PROCESS_ENGINE_CORE as ENGINE_CORE

_GRACE_S = 1.0  # a child whose pipe closed is usually gone within milliseconds


def _exit_code(proc: Any, deadline: float) -> int | None:
    while True:
        code = getattr(proc, "exitcode", None)
        if code is not None or time.monotonic() >= deadline:
            return code
        join = getattr(proc, "join", None)
        if join is None:
            return None
        join(0.05)


def _describe_exit(code: int) -> tuple[str | None, str]:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return name, f"killed by {name}"
    return None, f"exited with code {code}"


class ChildDeaths:
    """The ``fault`` part: the instrumented config, whose tracer provider's resource a dead
    child's spans carry. It holds nothing else: what a child published lives in its files."""

    def __init__(self, process_state: Any) -> None:
        self.config: config.Config = process_state.config


PART = "fault"


def end_dead_child_spans(chain: list[dict], reason: str, cfg: config.Config
                         ) -> int:
    """A killed child's open spans (from its published chain), ended now with an error."""
    now = clock.now_ns()
    resource = getattr(config.tracer_provider(cfg), "resource", None)
    sent = 0
    for item in reversed(chain):
        try:
            trace_id, span_id = int(item["trace_id"], 16), int(item["span_id"], 16)
            parent_id = int(item["parent_span_id"], 16) if item.get("parent_span_id") else None
            start = int(item["start_ns"])
        except (KeyError, TypeError, ValueError):
            continue
        flags = TraceFlags(TraceFlags.SAMPLED)
        attrs = {**(item.get("attributes") or {}), semconv.ATTR_SPAN_ENDED_BY: "parent"}
        if item.get("stage"):
            attrs.setdefault(semconv.ATTR_STAGE, item["stage"])
        kwargs = {"resource": resource} if resource is not None else {}
        inflight.send(ReadableSpan(
            name=str(item.get("name") or "?"),
            context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags),
            parent=SpanContext(trace_id, parent_id, is_remote=True, trace_flags=flags)
            if parent_id else None,
            attributes=attrs, status=Status(StatusCode.ERROR, reason),
            start_time=start, end_time=max(now, start), **kwargs))
        sent += 1
    return sent


def report_dead_children(procs: list[Any], kind: str, cfg: config.Config) -> int:
    """Report every process in ``procs`` that has died (nonzero exit) on the current span."""
    deadline = time.monotonic() + _GRACE_S
    span = trace.get_current_span()
    reported = 0
    for proc in procs:
        code = _exit_code(proc, deadline)
        if code is None or code == 0 or getattr(proc, "pid", None) is None:
            continue
        sig, how = _describe_exit(code)
        published = state_files.read_open_chain(proc.pid, remove=True) or {}
        chain = published.get("open") or []
        innermost = next((c for c in reversed(chain)
                          if inflight.is_activation_stage(c.get("stage"))), None)
        attrs: dict[str, Any] = {semconv.ATTR_CHILD_PID: proc.pid,
                                 semconv.ATTR_CHILD_EXIT_CODE: code,
                                 semconv.ATTR_PROCESS_KIND: published.get("process_kind") or kind}
        if sig:
            attrs[semconv.ATTR_CHILD_SIGNAL] = sig
        if innermost is not None:
            attrs[semconv.ATTR_CHILD_STAGE] = innermost["stage"]
            attrs[semconv.ATTR_CHILD_SPAN] = innermost["name"]
        where = f" in {innermost['stage']} ({innermost['name']})" if innermost else ""
        reason = f"{kind} pid {proc.pid} {how}{where}"
        if chain:
            end_dead_child_spans(chain, reason, cfg)
        if innermost is not None:
            ctx = trace.SpanContext(int(innermost["trace_id"], 16),
                                    int(innermost["span_id"], 16), is_remote=True)
            inflight.record_failure(ctx, innermost["stage"], innermost["name"], reason,
                                    attrs[semconv.ATTR_PROCESS_KIND])
        if span.is_recording():
            span.add_event(semconv.EVENT_CHILD_DIED, attrs)
            span.set_attributes({k: v for k, v in attrs.items()
                                 if k != semconv.ATTR_PROCESS_KIND})
            span.set_status(Status(StatusCode.ERROR, reason))
        reported += 1
    return reported


def _wrap_wait_for_workers(deaths: ChildDeaths, call, instance, args, kwargs):
    handles = args[0] if args else kwargs.get("unready_proc_handles", [])
    try:
        return call(*args, **kwargs)
    except BaseException:
        report_dead_children([getattr(h, "proc", None) for h in handles
                              if getattr(h, "proc", None) is not None], semconv.PROCESS_WORKER,
                             deaths.config)
        raise


def _wrap_wait_for_engine(deaths: ChildDeaths, call, instance, args, kwargs):
    launch = args[5] if len(args) > 5 else kwargs.get("launch")
    try:
        return call(*args, **kwargs)
    except BaseException:
        manager = getattr(launch, "engine_manager", None)
        report_dead_children(list(getattr(manager, "processes", None) or []), ENGINE_CORE,
                             deaths.config)
        raise


HOOKS = [
    Hook("fault.worker_died", "vllm.v1.executor.multiproc_executor:WorkerProc.wait_for_ready",
         _wrap_wait_for_workers, stage=semconv.STAGE_WARMUP, process=ENGINE_CORE, state=PART),
    Hook("fault.engine_core_died", "vllm.v1.engine.utils:wait_for_engine_startup",
         _wrap_wait_for_engine, stage=semconv.STAGE_WARMUP, process=API_SERVER, state=PART),
]
