"""Worker side of the request path, kept on the worker's part (:class:`WorkerSteps`) and handed to
EngineCore one way, as one attribute (``payload.WORKER_NOTES_ATTR``) of the step's
``ModelRunnerOutput``, set where the worker hands the output back (``Worker.execute_model`` /
``sample_tokens``, or an async output's ``get_output``); ``engine`` charges it to the requests
that were waiting for their first token when it started:

- warm-up paid inside a step: a LoRA adapter loaded lazily; a torch.compile, from torch's Dynamo
  compile callbacks (registered at the first step, so start-up's compiles keep their own spans in
  ``hooks.warmup``), with its compile id, whether it recompiled, whether it was vLLM's model graph
  (inside ``monitor_torch_compile``: ``warmup.compile``, else ``warmup.step_compile``) and what
  was compiled (Dynamo's own record, ``get_compilation_metrics``); a ``@triton.jit`` kernel
  compiled in a step (Model Runner V2's logprobs, its sampling kernels), from Triton's own hooks
  (``kernels``), noted the same way with ``compiler="triton"``;
- contention: a CPU worker's step that runs some prefill, on the wall clock and the thread's CPU
  clock (their difference is time it wanted a CPU and had none) and its run-queue delay, with the
  worker's major faults, the host's steal time and its cgroup's throttling since its previous
  timed step (``hostwait``: why a step began late, when EngineCore's hand-off stamps in
  ``engine`` show that it did); on a GPU the thread blocks on the device by design, so no step
  is timed;
- on a GPU with CUDA graphs captured, the graph decision for a step that starts a prefill
  (``graphs``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from otel_ttft.runtime.hooks.request.hostwait import HostClock, HostReading
from otel_ttft.runtime.hooks.request.kernels import TritonCompiles
from otel_ttft.runtime.hooks.request.payload import (
    WORKER_NOTES_ATTR,
    AdapterLoad,
    CompileTime,
    GraphChoice,
    GraphDispatch,
    PrefillStep,
    StepTime,
    WorkerNotes,
)
from otel_ttft.runtime.hooks.request.runqueue import RunQueueClock

Note = AdapterLoad | CompileTime | GraphDispatch

_IN_MODEL_COMPILE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "otel_ttft_model_compile", default=False)
"""Inside vLLM's own model-compile bracket (``model_compile``) on this thread: Dynamo compiles
synchronously in the caller's context, so its start callback reads it there."""


@contextlib.contextmanager
def model_compile(inner_cm: Any) -> Iterator[None]:
    """vLLM's own bracket around its model's compile (``monitor_torch_compile``), entered in a
    step: a Dynamo compile inside it is the model graph's."""
    token = _IN_MODEL_COMPILE.set(True)
    try:
        with inner_cm:
            yield
    finally:
        _IN_MODEL_COMPILE.reset(token)


@dataclass(slots=True)
class _Compiling:
    start: float
    compile_id: str
    model_graph: bool


def _frames() -> dict[str, str]:
    """compile id -> ``file:function`` for Dynamo's latest compiles (its own bounded record)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return {}
    return {str(m.compile_id): f"{os.path.basename(m.co_filename or '')}:{m.co_name}"
            for m in get_compilation_metrics() if m.co_name}


class WorkerSteps:
    """This worker's part (``request.worker``): what it noted (warm-up timed, CUDA-graph
    decisions) and the CPU steps it timed, not yet shipped; the step running now; the prompts
    still prefilling; its run-queue clock; Dynamo's callbacks, once registered."""

    def __init__(self) -> None:
        self.notes: list[Note] = []
        self.steps: list[PrefillStep] = []
        self.last_step: Any = None  # the latest step's SchedulerOutput (None: start-up)
        self.graph_shipped: Any = None  # the SchedulerOutput whose CUDA-graph decision shipped
        self.graph_pending: GraphDispatch | None = None  # the current step's, until its output
        self.graph_step: Any = None  # the SchedulerOutput ``graph_pending`` belongs to
        self.compiling: _Compiling | None = None
        self.prefilling: dict[str, int] = {}  # request id -> prompt tokens still to compute
        self.open: PrefillStep | None = None  # the timed step whose sample_tokens is to come
        self.cpu_worker: bool | None = None  # the worker's device is a CPU (None: not known)
        self.run_queue = RunQueueClock(with_io_threads=True)  # the worker's (and wake-up's) wait
        self.queued_last: float | None = None  # its run-queue reading at the latest step
        self.host = HostClock()  # faults, steal, throttling: why a step began late
        self.host_last: HostReading | None = None
        self.callbacks: Any = None  # Dynamo's handler while registered (False: tried, or closed)
        self.triton = TritonCompiles(self._kernel_compiled)  # Triton's JIT hooks, at first step
        self.closed = False

    def close(self) -> None:
        self.closed = True
        handler, self.callbacks = self.callbacks, False  # never registered again
        self.triton.remove()
        if handler:
            with contextlib.suppress(ValueError):  # (gone already: ``torch._dynamo.reset()``)
                handler.remove_start_callback(self._compile_started)
            with contextlib.suppress(ValueError):
                handler.remove_end_callback(self._compile_ended)
        self.run_queue.close()
        self.host.close()
        self.graph_pending = self.graph_step = self.graph_shipped = None
        self.notes.clear()
        self.steps.clear()
        self.prefilling.clear()

    # --- notes -------------------------------------------------------------------------------

    def keep(self, note: Note) -> None:
        """Ship ``note`` with the next step's output."""
        self.notes.append(note)
        del self.notes[:-64]

    def attach(self, output: Any) -> Any:
        """Hand what is pending to EngineCore on ``output``, a ``ModelRunnerOutput``: the one
        way from a worker to EngineCore. A reused output object (vLLM's empty one) is cleared."""
        if not hasattr(output, "req_id_to_index"):
            return output
        if self.graph_pending is not None:
            self._ship_graph(getattr(output, "cudagraph_stats", None))
        if self.notes or self.steps:
            setattr(output, WORKER_NOTES_ATTR, WorkerNotes(_named(_take(self.notes)),
                                                           _take(self.steps)))
        elif getattr(output, WORKER_NOTES_ATTR, None) is not None:
            setattr(output, WORKER_NOTES_ATTR, None)
        return output

    # --- compiles ----------------------------------------------------------------------------

    def _watch_compiles(self) -> None:
        """Dynamo's callbacks and Triton's JIT hooks, registered once, at the worker's first
        step."""
        self.callbacks = False  # tried: never twice
        self.triton.install()
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return
        callback_handler.register_start_callback(self._compile_started)
        callback_handler.register_end_callback(self._compile_ended)
        self.callbacks = callback_handler

    def _compile_started(self, args: Any) -> None:
        """An outermost Dynamo compile begins (torch's start callback)."""
        if not self.closed:
            self.compiling = _Compiling(time.monotonic(), str(args.compile_id),
                                        _IN_MODEL_COMPILE.get())

    def _compile_ended(self, args: Any) -> None:
        """That compile is done (torch's end callback)."""
        started, self.compiling = self.compiling, None
        if started is None or self.closed:
            return
        attempt = started.compile_id.rpartition("/")[2]
        step = self.last_step
        self.keep(CompileTime(
            started.start, time.monotonic(), "", started.compile_id,
            attempt.isdigit() and int(attempt) > 0, started.model_graph,
            int(getattr(step, "total_num_scheduled_tokens", 0) or 0),
            len(getattr(step, "num_scheduled_tokens", None) or ())))

    def _kernel_compiled(self, start: float, end: float, frame: str, attempt: int) -> None:
        """A Triton kernel compiled (``kernels``); inside a Dynamo compile it is part of that."""
        if self.closed or self.compiling is not None:
            return
        step = self.last_step
        self.keep(CompileTime(
            start, end, frame, f"triton/{attempt}", attempt > 0, False,
            int(getattr(step, "total_num_scheduled_tokens", 0) or 0),
            len(getattr(step, "num_scheduled_tokens", None) or ()), compiler="triton"))

    # --- CUDA-graph decisions (``graphs``) ----------------------------------------------------

    def prefill_step(self) -> Any:
        """The current step, if it starts some request's prefill and its CUDA-graph decision has
        not shipped yet."""
        step = self.last_step
        if step is None or step is self.graph_shipped or not step.scheduled_new_reqs:
            return None
        return step

    def note_graph(self, step: Any, choice: GraphChoice) -> None:
        """The CUDA-graph decision of ``step``, for the requests it starts; a later dispatch for
        the same step (after data-parallel ranks agreed on a padded size) replaces it, the
        step's own token count kept. It ships with the step's output (:meth:`attach`)."""
        pending = self.graph_pending
        if pending is not None and self.graph_step is not step:
            self._ship_graph(None)
        elif pending is not None:
            choice = msgspec.structs.replace(choice, tokens=pending.choice.tokens)
        self.graph_pending = GraphDispatch(choice, [r.req_id for r in step.scheduled_new_reqs])
        self.graph_step = step

    def _ship_graph(self, stats: Any) -> None:
        """The pending decision joins the notes; vLLM's own record of the step
        (``cudagraph_stats``: the mode and padding that ran) over the dispatcher's answer."""
        pending, self.graph_pending = self.graph_pending, None
        if pending is None:
            return
        choice = pending.choice
        if stats is not None:
            choice = msgspec.structs.replace(
                choice, mode=str(stats.runtime_mode).rpartition(".")[2],
                padded=int(stats.num_padded_tokens), source="cudagraph_stats")
        self.graph_shipped = self.graph_step
        self.keep(GraphDispatch(choice, pending.request_ids))

    # --- steps -------------------------------------------------------------------------------

    def _prefill_ids(self, scheduler_output: Any) -> list[str]:
        """The requests whose prompt this step computes (part of), and what is left of each."""
        prefilling = self.prefilling
        scheduled = scheduler_output.num_scheduled_tokens
        for rid in scheduler_output.finished_req_ids:
            prefilling.pop(rid, None)
        ids = []
        for rid in list(prefilling):
            n = scheduled.get(rid)
            if n is None:
                continue
            ids.append(rid)
            left = prefilling[rid] - n
            if left > 0:
                prefilling[rid] = left
            else:
                del prefilling[rid]
        for new in scheduler_output.scheduled_new_reqs:
            ids.append(new.req_id)
            prompt = new.prompt_token_ids
            left = (len(prompt) if prompt is not None else 0) - new.num_computed_tokens \
                - scheduled.get(new.req_id, 0)
            if left > 0 and len(prefilling) < 4096:
                prefilling[new.req_id] = left
        return ids

    def close_step(self) -> None:
        step, self.open = self.open, None
        if step is not None:
            self.steps.append(step)
            del self.steps[:-256]

    def is_cpu_worker(self, worker: Any) -> bool:
        if self.cpu_worker is None:
            device = getattr(worker, "device", None)
            self.cpu_worker = getattr(device, "type", None) == "cpu"
        return self.cpu_worker

    def timed(self, call: Callable[..., Any], args: tuple, kwargs: dict, step: StepTime) -> Any:
        wall, cpu, queued = time.monotonic(), time.thread_time(), self.run_queue.seconds()
        try:
            return call(*args, **kwargs)
        finally:
            step.end = time.monotonic()
            step.wall += step.end - wall
            step.cpu += time.thread_time() - cpu
            if queued is not None:
                self.queued_last = self.run_queue.seconds()
                if self.queued_last is not None:
                    step.queued += self.queued_last - queued

    def host_since_last(self) -> HostReading:
        """Major faults, steal and throttling since the previous timed step (the first: none)."""
        now = self.host.read()
        last, self.host_last = self.host_last, now
        if last is None:
            return HostReading()
        return HostReading(max(0, now.major_faults - last.major_faults),
                           max(0.0, now.steal_s - last.steal_s),
                           max(0.0, now.throttled_s - last.throttled_s))

    def queued_since_last(self) -> float:
        """The worker thread's run-queue wait since its previous step began or ended (waking up
        for this one included), and the reading taken now; every step of a CPU worker reads
        it."""
        queued = self.run_queue.seconds()
        last = self.queued_last
        self.queued_last = queued
        return queued - last if queued is not None and last is not None else 0.0


def _take(pending: list) -> list:
    """What ``pending`` holds, taken (an append from another thread in between stays)."""
    taken = pending[:]
    del pending[:len(taken)]
    return taken


def _named(notes: list[Note]) -> list[Note]:
    """Each compile with what Dynamo compiled, once its record is written (after the end
    callback, before the step's output is handed back)."""
    if not any(isinstance(n, CompileTime) and not n.frame for n in notes):
        return notes
    frames = _frames()
    return [msgspec.structs.replace(n, frame=frames.get(n.compile_id, ""))
            if isinstance(n, CompileTime) and not n.frame else n for n in notes]


# --- hooks (state="request.worker") ----------------------------------------------------------

def wrap_execute_model(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """``Worker.execute_model``: a step with a prefill in it is timed (on a CPU worker); an
    output handed back here carries what is pending."""
    if part.callbacks is None:
        part._watch_compiles()
    scheduler_output = part.last_step = args[0] if args else kwargs["scheduler_output"]
    if part.open is not None:  # the previous step had no sample_tokens call (pooling, no tokens)
        part.close_step()
    if not part.is_cpu_worker(instance):
        return part.attach(call(*args, **kwargs))
    before = part.queued_since_last()
    if not scheduler_output.scheduled_new_reqs and not part.prefilling:
        return part.attach(call(*args, **kwargs))
    ids = part._prefill_ids(scheduler_output)
    if not ids:
        return part.attach(call(*args, **kwargs))
    host = part.host_since_last()
    step = PrefillStep(StepTime(time.monotonic(), 0.0, 0.0, 0.0, queued_before=before,
                                major_faults=host.major_faults, steal=host.steal_s,
                                throttled=host.throttled_s), ids)
    output = part.timed(call, args, kwargs, step.time)
    part.open = step
    if output is not None:  # the step's output is here: no sample_tokens call follows
        part.close_step()
    return part.attach(output)


def wrap_sample_tokens(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                       kwargs: dict) -> Any:
    """``Worker.sample_tokens``: the second half of a timed step; its output carries what is
    pending."""
    step = part.open
    if step is None:
        return part.attach(call(*args, **kwargs))
    try:
        output = part.timed(call, args, kwargs, step.time)
    finally:
        part.close_step()
    return part.attach(output)


def wrap_get_output(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                    kwargs: dict) -> Any:
    """An async output's ``get_output`` (async scheduling): the resolved output carries what is
    pending. vLLM resolves it (and handles its failure) itself."""
    return part.attach(call(*args, **kwargs))


def wrap_load_adapter(part: WorkerSteps, call: Callable[..., Any], instance: Any, args: tuple,
                      kwargs: dict) -> Any:
    start = time.monotonic()
    result = call(*args, **kwargs)
    lora_request = args[0] if args else kwargs["lora_request"]
    part.keep(AdapterLoad(start, time.monotonic(), lora_request.lora_int_id))
    return result
