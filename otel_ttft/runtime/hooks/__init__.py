"""Hooks, one module per stage family; a family that outgrew a file is a package (``load``,
``request``). Each hook is data (see ``registry.Hook``)."""

from __future__ import annotations

from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.state import PartSpec


def all_hooks() -> list[Hook]:
    """Every hook. Our own modules import no vLLM module (targets resolve when vLLM imports
    them), so an ImportError here is a bug of ours and propagates."""
    from otel_ttft.runtime.hooks import (
        activation,
        fault,
        first_use,
        load,
        request,
        rpc,
        switch,
        warmup,
    )

    return [*activation.HOOKS, *load.HOOKS, *warmup.HOOKS, *rpc.HOOKS, *switch.HOOKS,
            *fault.HOOKS, *request.HOOKS,
            *first_use.HOOKS]


def all_parts() -> list[PartSpec]:
    """Every family's state part, in the order they are made (a part may read the ones made
    before it from the state being built); closed in the reverse order."""
    from otel_ttft.runtime.hooks import request

    return [
        # request path
        *request.PARTS,
    ]
