"""Correct parents for worker spans triggered over ``collective_rpc``.

A worker process inherits the traceparent of "Executor init" once, at spawn; everything EngineCore
later asks of it (profile run, KV allocation, warm-up, sleep/wake) would hang off that stale span.
For the few start-up methods (never ``execute_model``) we send, instead of the method name, a small
picklable callable that carries the caller's traceparent and runs the same method under it. The
worker needs nothing of ours installed to run it: vLLM's own ``run_method`` calls callables.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.semconv import PROCESS_ENGINE_CORE as ENGINE_CORE

# Start-up and activation methods only: the hot path (execute_model, sample_tokens) is untouched.
TRACED_RPC_METHODS = frozenset({
    "init_device", "load_model", "determine_available_memory", "initialize_from_config",
    "compile_or_warm_up_model", "get_kv_cache_spec", "initialize_cache", "sleep", "wake_up",
    "discard",
    "add_lora", "reset_prefix_cache",
})


LAST_STARTUP_METHOD = "compile_or_warm_up_model"


class TracedCall:
    """Runs ``worker.<method>(*args, **kwargs)`` under the caller's trace context."""

    def __init__(self, method: str, carrier: dict[str, str]):
        self.method = method
        self.carrier = carrier

    def __call__(self, worker: Any, *args: Any, **kwargs: Any) -> Any:
        token = otel_context.attach(TraceContextTextMapPropagator().extract(self.carrier))
        try:
            return getattr(worker, self.method)(*args, **kwargs)
        finally:
            otel_context.detach(token)
            if self.method == LAST_STARTUP_METHOD:
                from otel_ttft.runtime.telemetry import spans

                spans.flush_async(None)  # the worker's own provider (global)

    def __repr__(self) -> str:  # vLLM logs the method on failure
        return self.method


def _wrap_collective_rpc(call, instance, args, kwargs):
    method = args[0] if args else kwargs.get("method")
    if not isinstance(method, str):
        return call(*args, **kwargs)
    if method in TRACED_RPC_METHODS and trace.get_current_span().get_span_context().is_valid:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        traced = TracedCall(method, carrier)
        if args:
            args = (traced,) + tuple(args[1:])
        else:
            kwargs = {**kwargs, "method": traced}
    return call(*args, **kwargs)


COLLECTIVE_RPC = Hook(
    "rpc.parent_context",
    "vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc",
    _wrap_collective_rpc, process=ENGINE_CORE)

HOOKS = [COLLECTIVE_RPC]
