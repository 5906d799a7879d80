"""A worker's ranks, read from vLLM as it sets them up: the executor's global rank and vLLM's
parallel config when the worker process starts (``WorkerProc.__init__``, before its "Worker
init" span opens), then each rank in a group as vLLM builds the group (``GroupCoordinator``:
``world``, ``tp``, ``pp``, ``dp``; inside "Init device"). Held in the ``ranks`` part
(``runtime.ranks``), which every worker span and per-stage metric reads."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import ranks
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans

WORKER = "worker"

# vLLM's group names (``parallel_state``: group_name=...) -> our Ranks fields
_GROUPS = {"world": ("rank", "world_size"), "tp": ("tp_rank", "tp_size"),
           "pp": ("pp_rank", "pp_size"), "dp": ("dp_rank", "dp_size")}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _wrap_worker_proc(part: ranks.RankState, call, instance, args, kwargs):
    """WorkerProc(vllm_config, local_rank, rank, ...): the executor's rank and vLLM's parallel
    config, known before any span of this worker opens."""
    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    rank = kwargs.get("rank", args[2] if len(args) > 2 else None)
    parallel = getattr(vllm_config, "parallel_config", None)
    part.note(rank=_int(rank), world_size=_int(getattr(parallel, "world_size", None)),
              tp_size=_int(getattr(parallel, "tensor_parallel_size", None)),
              pp_size=_int(getattr(parallel, "pipeline_parallel_size", None)),
              dp_rank=_int(getattr(parallel, "data_parallel_rank", None)),
              dp_size=_int(getattr(parallel, "data_parallel_size", None)))
    return call(*args, **kwargs)


def _wrap_group(part: ranks.RankState, call, instance, args, kwargs):
    """A parallel group vLLM built: this process's rank in it. The span open now ("Init
    device", where the groups are built) gets the ranks too: it opened before they existed."""
    result = call(*args, **kwargs)
    name = str(getattr(instance, "unique_name", "") or "")
    group, _, index = name.partition(":")
    found = _GROUPS.get(group)
    if found is not None and index in ("", "0"):  # the first group of that name: this engine's
        rank_field, size_field = found
        known = part.note(**{rank_field: _int(getattr(instance, "rank_in_group", None)),
                             size_field: _int(getattr(instance, "world_size", None))})
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(known.attributes())
    return result


def _wrap_rendezvous(part: ranks.RankState, call, instance, args, kwargs):
    """init_distributed_environment(world_size, rank, ...): with several workers, each waits
    here until every rank has arrived; a span marked as that wait, so the slow rank's time is
    not read as this one's device init."""
    world = _int(args[0] if args else kwargs.get("world_size"))
    if part.tracer is None or part.identity is None or world is None or world < 2 \
            or not trace.get_current_span().is_recording():
        return call(*args, **kwargs)
    with spans.stage_span(semconv.SPAN_RANK_RENDEZVOUS, semconv.STAGE_WARMUP_DEVICE_INIT,
                          attributes={semconv.ATTR_PARALLEL_WAIT: True}, tracer=part.tracer,
                          identity=part.identity):
        return call(*args, **kwargs)


PART = ranks.PART
HOOKS = [
    Hook("ranks.worker", "vllm.v1.executor.multiproc_executor:WorkerProc.__init__",
         _wrap_worker_proc, process=WORKER, state=PART),
    # gpu_worker imports it by name; the CPU worker calls gpu_worker's distributed set-up
    Hook("ranks.rendezvous", "vllm.v1.worker.gpu_worker:init_distributed_environment",
         _wrap_rendezvous, stage=semconv.STAGE_WARMUP_DEVICE_INIT, process=WORKER, state=PART),
    Hook("ranks.group", "vllm.distributed.parallel_state:GroupCoordinator.__init__",
         _wrap_group, process=WORKER, state=PART),
]
