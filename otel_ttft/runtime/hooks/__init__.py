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
        ranks,
        request,
        rpc,
        switch,
        warmup,
    )

    return [*activation.HOOKS, *load.HOOKS, *warmup.HOOKS, *rpc.HOOKS, *switch.HOOKS,
            *fault.HOOKS, *request.HOOKS,
            *first_use.HOOKS,
            # last: outermost on WorkerProc.__init__, so the ranks are known before the worker's
            # first span (its process start) is emitted
            *ranks.HOOKS]


def all_parts() -> list[PartSpec]:
    """Every family's state part, in the order they are made (a part may read the ones made
    before it from the state being built); closed in the reverse order."""
    from otel_ttft.runtime import clock, inflight, ranks
    from otel_ttft.runtime.hooks import (
        activation,
        activation_verdict,
        fault,
        first_use,
        load,
        request,
        switch,
        warmup,
    )
    from otel_ttft.runtime.telemetry import bounded_export
    from otel_ttft.runtime.telemetry import metrics as stage_metrics

    return [
        # --- start-up path: exec -> ready, the eviction at a stop signal, what watches it ---
        PartSpec(clock.PART, clock.HandDown),
        PartSpec(ranks.PART, ranks.RankState),  # read by every span tagged and stage recorded
        PartSpec(bounded_export.PART, bounded_export.BoundedExit),
        PartSpec(stage_metrics.PART, stage_metrics.StageMetrics),
        PartSpec(inflight.PART, inflight.InflightWatch),
        PartSpec(activation_verdict.PART, activation_verdict.LiveVerdict),
        PartSpec(activation.PART, activation.ActivationState),
        PartSpec(warmup.PART, warmup.Warmup),
        PartSpec(fault.PART, fault.ChildDeaths),
        PartSpec(first_use.PART, first_use.FirstUse),
        PartSpec(switch.PART, switch.SwitchState),
        # --- load path ---
        *load.PARTS,
        # --- request path ---
        *request.PARTS,
    ]
