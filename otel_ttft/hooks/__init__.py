"""Hooks, one module per stage family. Each hook is data (see registry.Hook)."""

from __future__ import annotations

from otel_ttft.hooks.registry import Hook


def all_hooks() -> list[Hook]:
    from otel_ttft.hooks import (
        activation,
        fault,
        load,
        load_finish,
        load_formats,
        rpc,
        switch,
        warmup,
    )

    hooks = [*activation.HOOKS, *load.HOOKS, *load_formats.HOOKS, *load_finish.HOOKS,
             *warmup.HOOKS, *rpc.HOOKS, *switch.HOOKS, *fault.HOOKS]
    try:
        from otel_ttft.hooks import request
    except ImportError:
        return hooks
    return hooks + list(getattr(request, "HOOKS", []))
