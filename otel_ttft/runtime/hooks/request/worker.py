"""Worker side of the request path: warm-up paid inside a step (a LoRA adapter loaded lazily, a
torch.compile of something start-up did not compile) is timed here and handed to EngineCore with
the step's output: as an attribute of the next pickled ``ModelRunnerOutput`` (multiproc
executor), or in-process with one worker. ``engine`` charges it to the requests that were waiting
for their first token when it started.

Compiles: torch's Dynamo runs its compile callbacks around every outermost compile
(``CompilationCallbackHandler.run_start_callbacks`` / ``run_end_callbacks``); once this worker has
run a step, each compile is noted with what Dynamo compiled (the code object it was handed),
whether it is a recompile (Dynamo's attempt number), whether it was vLLM's own model graph
(inside vLLM's ``monitor_torch_compile`` bracket, which ``hooks.warmup`` hands to
:func:`model_compile`: the request then shows ``warmup.compile``, else ``warmup.step_compile``)
and the shape of the latest step. Nothing runs per step for it but one
assignment; start-up's compiles come before the first step and keep their own spans
(``hooks.warmup``).

Contention: a step that runs some request's prefill on a CPU worker is timed twice, on the wall
clock and on the worker thread's CPU clock (``time.thread_time()``), over ``Worker.execute_model``
and the step's ``Worker.sample_tokens`` (both run on the worker's main thread). Their difference
is time the worker wanted a CPU and had none (another process on its cores, the process stopped).
It ships as a :class:`payload.StepTime` per step with the ids of the requests it prefilled. On a
GPU the thread blocks on the device by design, so there the two clocks say nothing about
contention and no step is timed. Per step with no prefill in it: two truth tests.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from otel_ttft.runtime.hooks.request.payload import (
    AdapterLoad,
    CompileTime,
    GraphDispatch,
    StepTime,
)
from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock

WARMUP_ATTR = "_otel_ttft_warmup"
STEPS_ATTR = "_otel_ttft_steps"

Note = AdapterLoad | CompileTime | GraphDispatch

# what this process noted (warm-up timed, CUDA-graph decisions), not yet shipped
pending: list[Note] = []


def keep(event: Note) -> None:
    """Ship ``event`` with the next step's output."""
    pending.append(event)
    del pending[:-64]


@dataclass(slots=True)
class _Compiling:
    start: float
    compile_id: str
    frame: str
    model_graph: bool


_last_step: Any = None  # the latest step's SchedulerOutput (None: no step yet, start-up)
_compiling: _Compiling | None = None
_model_compiles = 0  # vLLM's model-compile brackets open now


def _compiled_frame() -> str:
    """``file:function`` of the code Dynamo was handed, found on the stack of the start
    callback (its compile loop holds it as ``code``); empty when not found."""
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            break
        code = frame.f_locals.get("code") if frame.f_code.co_filename.endswith(
            "convert_frame.py") else None
        if isinstance(code, types.CodeType):
            return f"{os.path.basename(code.co_filename)}:{code.co_name}"
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def model_compile(inner_cm: Any) -> Iterator[None]:
    """vLLM's own bracket around its model's compile (``monitor_torch_compile``), entered in a
    step: a Dynamo compile inside it is the model graph's."""
    global _model_compiles
    _model_compiles += 1
    try:
        with inner_cm:
            yield
    finally:
        _model_compiles -= 1


def wrap_compile_start(call: Callable[..., Any], instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """``CompilationCallbackHandler.run_start_callbacks``: an outermost Dynamo compile begins."""
    global _compiling
    if _last_step is not None:
        callback_args = args[0] if args else kwargs["args"]
        _compiling = _Compiling(time.monotonic(), str(callback_args.compile_id),
                                _compiled_frame(), _model_compiles > 0)
    return call(*args, **kwargs)


def wrap_compile_end(call: Callable[..., Any], instance: Any, args: tuple,
                     kwargs: dict) -> Any:
    """``CompilationCallbackHandler.run_end_callbacks``: that compile is done."""
    global _compiling
    try:
        return call(*args, **kwargs)
    finally:
        started, _compiling = _compiling, None
        if started is not None:
            attempt = started.compile_id.rpartition("/")[2]
            step = _last_step
            keep(CompileTime(
                started.start, time.monotonic(), started.frame, started.compile_id,
                attempt.isdigit() and int(attempt) > 0, started.model_graph,
                int(getattr(step, "total_num_scheduled_tokens", 0) or 0),
                len(getattr(step, "num_scheduled_tokens", None) or ())))


@dataclass(slots=True)
class PrefillStep:
    """A step timed on a CPU worker, and the requests whose prefill it ran."""

    time: StepTime
    request_ids: list[str]


@dataclass(slots=True)
class _OpenStep:
    start: float
    end: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0
    queued: float = 0.0
    queued_before: float = 0.0
    request_ids: list[str] = field(default_factory=list)


# steps timed in this process, not yet shipped
steps: list[PrefillStep] = []
# request id -> prompt tokens its prefill has still to compute (chunked prefill), bounded
_prefilling: dict[str, int] = {}
_open: _OpenStep | None = None  # the step whose sample_tokens is still to come
_cpu_worker: bool | None = None  # the worker's device is a CPU (None: not known yet)
_run_queue = RunQueueClock(with_io_threads=True)  # the worker's (and its wake-up's) wait
_queued_last: float | None = None  # its run-queue reading at the latest step's start or end


def latest_step() -> Any:
    """The ``SchedulerOutput`` of the step this worker runs now (or ran last); ``None`` before
    its first."""
    return _last_step


def take_local() -> list[Note] | None:
    """What is pending, taken (uniproc executor: EngineCore reads it in-process)."""
    if not pending:
        return None
    events = pending[:]
    del pending[:len(events)]  # an append from another thread in between stays queued
    return events


def take_local_steps() -> list[PrefillStep] | None:
    """The timed steps, taken (uniproc executor: EngineCore reads them in-process)."""
    if not steps:
        return None
    taken = steps[:]
    del steps[:len(taken)]
    return taken


def _prefill_ids(scheduler_output: Any) -> list[str]:
    """The requests whose prompt this step computes (part of), and what is left of each."""
    scheduled = scheduler_output.num_scheduled_tokens
    for rid in scheduler_output.finished_req_ids:
        _prefilling.pop(rid, None)
    ids = []
    for rid in list(_prefilling):
        n = scheduled.get(rid)
        if n is None:
            continue
        ids.append(rid)
        left = _prefilling[rid] - n
        if left > 0:
            _prefilling[rid] = left
        else:
            del _prefilling[rid]
    for new in scheduler_output.scheduled_new_reqs:
        ids.append(new.req_id)
        prompt = new.prompt_token_ids
        left = (len(prompt) if prompt is not None else 0) - new.num_computed_tokens \
            - scheduled.get(new.req_id, 0)
        if left > 0 and len(_prefilling) < 4096:
            _prefilling[new.req_id] = left
    return ids


def _close_step() -> None:
    global _open
    step, _open = _open, None
    if step is not None:
        steps.append(PrefillStep(StepTime(step.start, step.end, step.wall, step.cpu,
                                          step.queued, step.queued_before),
                                 step.request_ids))
        del steps[:-256]


def _is_cpu_worker(worker: Any) -> bool:
    global _cpu_worker
    if _cpu_worker is None:
        device = getattr(worker, "device", None)
        _cpu_worker = getattr(device, "type", None) == "cpu"
    return _cpu_worker


def _timed(call: Callable[..., Any], args: tuple, kwargs: dict, step: _OpenStep) -> Any:
    global _queued_last
    wall, cpu, queued = time.monotonic(), time.thread_time(), _run_queue.seconds()
    try:
        return call(*args, **kwargs)
    finally:
        step.end = time.monotonic()
        step.wall += step.end - wall
        step.cpu += time.thread_time() - cpu
        if queued is not None:
            _queued_last = _run_queue.seconds()
            if _queued_last is not None:
                step.queued += _queued_last - queued


def _queued_since_last() -> float:
    """The worker thread's run-queue wait since its previous step began or ended (waking up for
    this one included), and the reading taken now; every step of a CPU worker reads it."""
    global _queued_last
    queued = _run_queue.seconds()
    before = queued - _queued_last if queued is not None and _queued_last is not None else 0.0
    _queued_last = queued
    return before


def wrap_execute_model(call: Callable[..., Any], instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """``Worker.execute_model``: a step with a prefill in it is timed (on a CPU worker)."""
    global _last_step
    _last_step = args[0] if args else kwargs["scheduler_output"]
    if _open is not None:  # the previous step had no sample_tokens call (pooling, no tokens)
        _close_step()
    scheduler_output = _last_step
    if not _is_cpu_worker(instance):
        return call(*args, **kwargs)
    before = _queued_since_last()
    if not scheduler_output.scheduled_new_reqs and not _prefilling:
        return call(*args, **kwargs)
    ids = _prefill_ids(scheduler_output)
    if not ids:
        return call(*args, **kwargs)
    step = _OpenStep(time.monotonic(), queued_before=before, request_ids=ids)
    output = _timed(call, args, kwargs, step)
    _open_or_close(step, output)
    return output


def _open_or_close(step: _OpenStep, output: Any) -> None:
    global _open
    _open = step
    if output is not None:  # the step's output is here: no sample_tokens call follows
        _close_step()


def wrap_sample_tokens(call: Callable[..., Any], instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """``Worker.sample_tokens``: the second half of a timed step."""
    step = _open
    if step is None:
        return call(*args, **kwargs)
    try:
        return _timed(call, args, kwargs, step)
    finally:
        _close_step()


def wrap_load_adapter(call: Callable[..., Any], instance: Any, args: tuple,
                      kwargs: dict) -> Any:
    start = time.monotonic()
    result = call(*args, **kwargs)
    lora_request = args[0] if args else kwargs["lora_request"]
    keep(AdapterLoad(start, time.monotonic(), lora_request.lora_int_id))
    return result


def _attach(output: Any) -> Any:
    if hasattr(output, "req_id_to_index"):  # a ModelRunnerOutput: pickled to EngineCore
        events = take_local()
        if events:
            setattr(output, WARMUP_ATTR, events)
        timed = take_local_steps()
        if timed:
            setattr(output, STEPS_ATTR, timed)
    return output


class _ResolveAndAttach:
    """Stands in for an ``AsyncModelRunnerOutput.get_output``: vLLM resolves the output itself
    (and handles its failure its own way, e.g. 0.33's ``FAILURE_WITH_KV_OUTPUT``); a resolved
    output gets the pending times."""

    __slots__ = ("get_output",)

    def __init__(self, get_output: Callable[[], Any]):
        self.get_output = get_output

    def __call__(self) -> Any:
        return _attach(self.get_output())


def wrap_enqueue_output(call: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``WorkerProc.enqueue_output``: attach pending warm-up and step times to the step's
    output."""
    if pending or steps:
        output = args[0] if args else kwargs["output"]
        if hasattr(output, "get_output"):  # AsyncModelRunnerOutput: resolved inside vLLM's call
            output.get_output = _ResolveAndAttach(output.get_output)
        else:
            _attach(output)
    return call(*args, **kwargs)
