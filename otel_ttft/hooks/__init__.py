"""Hooks, one module per stage family; the request path is one package (``request``). Each hook
is data (see ``registry.Hook``)."""

from __future__ import annotations

from otel_ttft.hooks.registry import Hook


def all_hooks() -> list[Hook]:
    """Every hook. Our own modules import no vLLM module (targets resolve when vLLM imports
    them), so an ImportError here is a bug of ours and propagates."""
    from otel_ttft.hooks import (
        activation,
        fault,
        load,
        load_finish,
        load_formats,
        request,
        rpc,
        switch,
        warmup,
    )

    return [*activation.HOOKS, *load.HOOKS, *load_formats.HOOKS, *load_finish.HOOKS,
            *warmup.HOOKS, *rpc.HOOKS, *switch.HOOKS, *fault.HOOKS, *request.HOOKS]
