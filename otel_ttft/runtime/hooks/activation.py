"""One trace per engine activation, across the API server, EngineCore and worker processes.

The root ("vllm.activation") lives in the API process: it starts when that process was exec'd and
ends when the HTTP server is ready. vLLM's own start-up spans and ours nest under it: the API-side
calls run with the root as their parent, and vLLM hands that context to EngineCore and the workers
through the environment. Each process adds "process start and imports": from exec to its first
span, time vLLM's spans leave out. Wake-up from sleep is an activation of its own (EngineCore).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext, Status, StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, handoff, inflight, state_files
from otel_ttft.runtime.hooks import activation_verdict
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans

API_SERVER, ENGINE_CORE, WORKER = semconv.PROCESS_KINDS


@dataclass
class Activation:
    """What a request needs to know about the activation it may have waited on."""

    kind: str  # start | wake | adapter
    span_context: SpanContext | None
    start_ns: int
    ready_ns: int | None = None


class ActivationState:
    """The ``activation`` part: what this process knows of its activations.

    ``root``: the API server's "vllm.activation" span, open from exec until the HTTP server
    listens; ``frontend_span``: app build -> HTTP server listening, under it; ``latest``: the
    latest activation (start, wake-up) of this process, read once per request (``cold``);
    ``process_start_emitted``: the "process start and imports" span is emitted once per process;
    ``identity``: the process's (``state.ProcessIdentity``), which these hooks alone set.
    Closing it ends what is still open (an uninstrumented server has no activation to finish).
    """

    def __init__(self, process_state: Any) -> None:
        self.config = process_state.config
        self.tracer = process_state.tracer
        self.identity = process_state.identity
        self.lock = threading.Lock()
        self.root: trace.Span | None = None
        self.frontend_span: trace.Span | None = None
        self.latest: Activation | None = None
        self.process_start_emitted = False
        self.verdict = process_state.part(activation_verdict.PART)  # judges it at ready

    def tracing_ready(self) -> bool:
        return config.tracing_ready(self.config)

    def emit_process_start(self, kind: str, parent: otel_context.Context | None,
                           end_ns: int | None = None) -> None:
        """Once per process: exec -> first traced point (interpreter start, imports, arg
        parsing)."""
        if self.process_start_emitted or not self.tracing_ready():
            return
        start_ns = clock.process_start_ns()
        if start_ns is None:
            return
        self.process_start_emitted = True
        self.identity.set_kind(kind)
        end = end_ns if end_ns is not None else clock.now_ns()
        spans.emit_span(semconv.SPAN_PROCESS_START, start_ns, end,
                        stage=semconv.STAGE_WARMUP_PROCESS_START, context=parent,
                        attributes={semconv.PROCESS_PID: _pid()}, tracer=self.tracer,
                        identity=self.identity)

    def ensure_root(self) -> trace.Span | None:
        """The API process's activation root, opened at first need with its start at exec."""
        if self.root is not None:
            return self.root
        if not self.tracing_ready():
            return None
        with self.lock:
            if self.root is not None:
                return self.root
            self.identity.set_kind(API_SERVER)
            start_ns = clock.process_start_ns() or clock.now_ns()
            root = self.tracer.start_span(semconv.SPAN_ACTIVATION,
                                          context=handoff.env_parent_context(),
                                          start_time=start_ns)
            root.set_attributes({semconv.ATTR_ACTIVATION_KIND: "start",
                                 semconv.ATTR_PROCESS_KIND: API_SERVER,
                                 semconv.PROCESS_PID: _pid()})
            if self.identity.served_model:
                root.set_attribute(semconv.GEN_AI_REQUEST_MODEL, self.identity.served_model)
            self.root = root
            self.latest = Activation("start", root.get_span_context(), start_ns)
        self.emit_process_start(API_SERVER, trace.set_span_in_context(root))
        return self.root

    def end_root(self, error: BaseException | None = None) -> None:
        """Ready (or failed): close the root once."""
        root = self.root
        if root is None or not root.is_recording():
            return
        end = clock.now_ns()
        frontend = self.frontend_span
        if frontend is not None and frontend.is_recording():
            if error is not None:
                frontend.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            frontend.end(end_time=end)
        if self.identity.served_model:
            root.set_attribute(semconv.GEN_AI_REQUEST_MODEL, self.identity.served_model)
        root.set_attribute(semconv.ATTR_ACTIVATION_READY, error is None)
        if error is not None:
            root.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            mark_failed_stage(root)
        elif self.latest is not None:
            self.latest.ready_ns = end
            self.verdict.on_ready(root, self.latest.start_ns, end)  # before it ends
        root.end(end_time=end)

    def close(self) -> None:
        """Uninstrumented before ready: the front-end span and the root end now, marked so."""
        end = clock.now_ns()
        for span in (self.frontend_span, self.root):
            if span is not None and span.is_recording():
                span.set_attribute(semconv.ATTR_SPAN_ENDED_BY, UNINSTRUMENTED)
                span.end(end_time=end)


    def note_model(self, vllm_config: Any) -> None:
        """The model this process serves, from vLLM's config (its served name, else its path)."""
        model_config = getattr(vllm_config, "model_config", None)
        name = getattr(model_config, "served_model_name", None) \
            or getattr(model_config, "model", None)
        if isinstance(name, (list, tuple)):
            name = name[0] if name else None
        if name:
            self.identity.served_model = str(name)


UNINSTRUMENTED = "uninstrument"


def _pid() -> int:
    import os

    return os.getpid()


def mark_failed_stage(root: trace.Span) -> None:
    """The stage the activation died in: recorded by whichever process failed first (a child's
    own error, or a parent that saw its child killed), else the innermost one still open here."""
    record = state_files.take_failure(root.get_span_context().trace_id)
    stage = record.get("stage") if record else None
    if not stage:
        tracker = inflight.tracker()
        inner = tracker.innermost() if tracker is not None else None
        stage = inflight.span_stage(inner) if inner is not None else None
    if stage:
        root.set_attribute(semconv.ATTR_ACTIVATION_FAILED_STAGE, str(stage))


def _under_root(act: ActivationState) -> object | None:
    """Attach the activation root as parent unless a span is already current; the token or None."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    root = act.ensure_root()
    if root is None:
        return None
    return otel_context.attach(trace.set_span_in_context(root))


def _wrap_api_call(act, call, instance, args, kwargs):
    """setup_server, make_async_mp_client: vLLM's spans under the root."""
    token = _under_root(act)
    try:
        return call(*args, **kwargs)
    finally:
        if token is not None:
            otel_context.detach(token)


def _wrap_named_api_call(span_name: str, stage: str):
    def wrapper(act, call, instance, args, kwargs):
        if args and hasattr(args[0], "model_config"):
            act.note_model(args[0])
            act.verdict.note_config(args[0])
        elif "vllm_config" in kwargs:
            act.note_model(kwargs["vllm_config"])
            act.verdict.note_config(kwargs["vllm_config"])
        token = _under_root(act)
        try:
            if token is None and not trace.get_current_span().is_recording():
                return call(*args, **kwargs)
            with spans.stage_span(span_name, stage, tracer=act.tracer, identity=act.identity):
                return call(*args, **kwargs)
        finally:
            if token is not None:
                otel_context.detach(token)

    return wrapper


_engine_client = _wrap_named_api_call(semconv.SPAN_ENGINE_CLIENT, semconv.STAGE_WARMUP)


def _wrap_offline_engine(act, call, instance, args, kwargs):
    """Offline ``LLM(...)``: no HTTP server, so the activation is ready when the engine is."""
    try:
        result = _engine_client(act, call, instance, args, kwargs)
    except BaseException as exc:
        act.end_root(exc)
        raise
    act.end_root()
    return result


async def _wrap_build_and_serve(act, call, instance, args, kwargs):
    """App build and HTTP start: a span that ends when uvicorn listens, not when it stops."""
    root = None if trace.get_current_span().get_span_context().is_valid else act.ensure_root()
    if root is None:
        return await call(*args, **kwargs)
    act.frontend_span = frontend = act.tracer.start_span(
        semconv.SPAN_FRONTEND_SETUP, context=trace.set_span_in_context(root),
        start_time=clock.now_ns(), attributes={semconv.ATTR_STAGE: semconv.STAGE_WARMUP_FRONTEND})
    spans.tag_span(frontend, semconv.STAGE_WARMUP_FRONTEND, None, act.identity)
    token = otel_context.attach(trace.set_span_in_context(frontend))
    try:
        return await call(*args, **kwargs)
    except BaseException as exc:
        act.end_root(exc)
        raise
    finally:
        otel_context.detach(token)


async def _wrap_serve_http(call, instance, args, kwargs):
    """Serve with a clean context: request tasks must not inherit start-up spans."""
    token = otel_context.attach(otel_context.Context())
    try:
        return await call(*args, **kwargs)
    finally:
        otel_context.detach(token)


async def _wrap_uvicorn_startup(act, call, instance, args, kwargs):
    """uvicorn's startup returns once its sockets listen: the activation is ready."""
    result = await call(*args, **kwargs)
    if act.root is not None:
        act.end_root()
        spans.flush_async(act.config)
    return result


async def _wrap_run_server_worker(act, call, instance, args, kwargs):
    try:
        return await call(*args, **kwargs)
    except BaseException as exc:
        act.end_root(exc)
        raise


def _wrap_child_init(kind: str):
    """EngineCoreProc / WorkerProc __init__: our outer wrapper runs before vLLM's span opens."""

    def wrapper(act, call, instance, args, kwargs):
        act.note_model(kwargs.get("vllm_config") or (args[0] if args else None))
        if not trace.get_current_span().get_span_context().is_valid:
            act.emit_process_start(kind, handoff.env_parent_context())
        if act.identity.kind is None:
            act.identity.set_kind(kind)
        return call(*args, **kwargs)

    return wrapper


def on_plugin_loaded(act: ActivationState | None) -> None:
    """vLLM's plugin loader runs inside "EngineCoreProc init" / "Worker init" in children: the
    process-start span then ends where that span began (``act``: this process's activation
    part; None when not instrumented)."""
    current = trace.get_current_span()
    name = getattr(current, "name", None)
    kind = {"EngineCoreProc init": ENGINE_CORE, "Worker init": WORKER}.get(name or "")
    if act is None or kind is None or not current.is_recording():
        return
    # it opened before our stage tagger was attached: its stage and our process kind now
    spans.tag_span(current, semconv.VLLM_SPAN_STAGES[name], None, act.identity)
    act.emit_process_start(kind, handoff.env_parent_context(),
                           end_ns=getattr(current, "start_time", None))


def _wrap_busy_loop(act, call, instance, args, kwargs):
    """EngineCore is ready once its busy loop starts: export its start-up spans now."""
    spans.flush_async(act.config)
    return call(*args, **kwargs)


# --- wake-up from sleep: an activation of its own ------------------------------------------------
# Rooted in the API process (requests after it link to it); EngineCore's and the workers' wake-up
# spans join it through handoff, since vLLM's utility call carries no trace context.

@contextlib.contextmanager
def _wake_activation(act: ActivationState, process_kind: str) -> Iterator[trace.Span]:
    """The wake activation's root, current while the wake-up runs; ``latest`` when it ends."""
    start = clock.now_ns()
    root = act.tracer.start_span(semconv.SPAN_ACTIVATION, context=otel_context.Context(),
                                 start_time=start)
    root.set_attributes({semconv.ATTR_ACTIVATION_KIND: "wake",
                         semconv.ATTR_PROCESS_KIND: process_kind})
    token = otel_context.attach(trace.set_span_in_context(root))
    error: BaseException | None = None
    try:
        yield root
    except BaseException as exc:
        error = exc
        raise
    finally:
        otel_context.detach(token)
        end = clock.now_ns()
        root.set_attribute(semconv.ATTR_ACTIVATION_READY, error is None)
        if error is not None:
            root.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            mark_failed_stage(root)
        act.latest = Activation("wake", root.get_span_context(), start, end)
        root.end(end_time=end)


async def _wrap_api_wake_up(act, call, instance, args, kwargs):
    if not act.tracing_ready():
        return await call(*args, **kwargs)
    with _wake_activation(act, API_SERVER), handoff.offered("wake_up"):
        return await call(*args, **kwargs)


def _wrap_engine_wake_up(act, call, instance, args, kwargs):
    """EngineCore: under the API process's wake activation if it offered one, else a root here."""
    if not act.tracing_ready():
        return call(*args, **kwargs)
    attrs = {semconv.ATTR_WAKE_TAGS: _tags(args, kwargs)}
    parent = handoff.taken("wake_up")
    if parent is not None:
        with spans.stage_span(semconv.SPAN_WAKE_UP, semconv.STAGE_LOAD_H2D, attributes=attrs,
                              context=parent, tracer=act.tracer, identity=act.identity):
            return call(*args, **kwargs)
    with _wake_activation(act, act.identity.kind or ENGINE_CORE), \
            spans.stage_span(semconv.SPAN_WAKE_UP, semconv.STAGE_LOAD_H2D, attributes=attrs,
                             tracer=act.tracer, identity=act.identity):
        return call(*args, **kwargs)


def _tags(args, kwargs) -> list[str]:
    tags = args[0] if args else kwargs.get("tags")
    return [str(t) for t in tags] if tags else ["all"]


def _wrap_engine_sleep(act, call, instance, args, kwargs):
    """Sleep may finish later (EngineCore drains in-flight requests first): end the span then."""
    level = args[0] if args else kwargs.get("level", 1)
    # Under the API process's vllm.switch when it offered one (hooks/switch.py).
    span = act.tracer.start_span(semconv.SPAN_SLEEP, context=handoff.taken("sleep"),
                                 start_time=clock.now_ns(),
                                 attributes={semconv.ATTR_STAGE: semconv.STAGE_SWITCH_SLEEP})
    spans.tag_span(span, semconv.STAGE_SWITCH_SLEEP, {semconv.ATTR_SLEEP_LEVEL: int(level)},
                   act.identity)
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        result = call(*args, **kwargs)
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end(end_time=clock.now_ns())
        raise
    finally:
        otel_context.detach(token)
    if hasattr(result, "add_done_callback"):
        result.add_done_callback(lambda _f: span.end(end_time=clock.now_ns()))
    else:
        span.end(end_time=clock.now_ns())
    return result


def _wrap_worker_wake_up(act, call, instance, args, kwargs):
    with spans.stage_span(semconv.SPAN_WAKE_UP, semconv.STAGE_LOAD_H2D,
                          attributes={semconv.ATTR_WAKE_TAGS: _tags(args, kwargs)},
                          tracer=act.tracer, identity=act.identity):
        return call(*args, **kwargs)


PART = "activation"
_ENTRY = "vllm.entrypoints.launchers.api_server.entry"
_CORE = "vllm.v1.engine.core"
HOOKS = [
    # entry.py imports setup_server/serve_http by name: patch them where they are used.
    Hook("activation.api_setup", f"{_ENTRY}:setup_server",
         _wrap_api_call, stage=semconv.STAGE_WARMUP_FRONTEND, process=API_SERVER, state=PART),
    Hook("activation.engine_config", "vllm.engine.arg_utils:EngineArgs.create_engine_config",
         _wrap_named_api_call(semconv.SPAN_ENGINE_CONFIG, semconv.STAGE_WARMUP_FRONTEND),
         stage=semconv.STAGE_WARMUP_FRONTEND, process=API_SERVER, state=PART),
    Hook("activation.engine_client", "vllm.v1.engine.async_llm:AsyncLLM.__init__",
         _engine_client,
         stage=semconv.STAGE_WARMUP, process=API_SERVER, state=PART),
    Hook("activation.offline_engine", "vllm.v1.engine.llm_engine:LLMEngine.__init__",
         _wrap_offline_engine, stage=semconv.STAGE_WARMUP, process=API_SERVER, state=PART),
    Hook("activation.engine_start",
         "vllm.v1.engine.core_client:EngineCoreClient.make_async_mp_client",
         _wrap_api_call, stage=semconv.STAGE_WARMUP, process=API_SERVER, state=PART),
    Hook("activation.api_ready", f"{_ENTRY}:build_and_serve", _wrap_build_and_serve,
         stage=semconv.STAGE_WARMUP_FRONTEND, process=API_SERVER, state=PART),
    Hook("activation.serve_context", f"{_ENTRY}:serve_http", _wrap_serve_http,
         process=API_SERVER),
    Hook("activation.ready", "uvicorn.server:Server.startup", _wrap_uvicorn_startup,
         process=API_SERVER, state=PART),
    Hook("activation.failed", f"{_ENTRY}:run_server_worker", _wrap_run_server_worker,
         process=API_SERVER, state=PART),
    Hook("activation.engine_core_start", f"{_CORE}:EngineCoreProc.__init__",
         _wrap_child_init(ENGINE_CORE), stage=semconv.STAGE_WARMUP_PROCESS_START,
         process=ENGINE_CORE, state=PART),
    Hook("activation.worker_start", "vllm.v1.executor.multiproc_executor:WorkerProc.__init__",
         _wrap_child_init(WORKER), stage=semconv.STAGE_WARMUP_PROCESS_START, process=WORKER,
         state=PART),
    Hook("activation.engine_core_ready", f"{_CORE}:EngineCoreProc.run_busy_loop", _wrap_busy_loop,
         process=ENGINE_CORE, state=PART),
    Hook("switch.engine_sleep", f"{_CORE}:EngineCore.sleep", _wrap_engine_sleep,
         stage=semconv.STAGE_SWITCH_SLEEP, process=ENGINE_CORE, state=PART),
    Hook("switch.api_wake_up", "vllm.v1.engine.async_llm:AsyncLLM.wake_up", _wrap_api_wake_up,
         stage=semconv.STAGE_LOAD_H2D, process=API_SERVER, state=PART),
    Hook("switch.engine_wake_up", f"{_CORE}:EngineCore.wake_up", _wrap_engine_wake_up,
         stage=semconv.STAGE_LOAD_H2D, process=ENGINE_CORE, state=PART),
    Hook("switch.worker_sleep", "vllm.v1.worker.gpu_worker:Worker.sleep", _wrap_engine_sleep,
         stage=semconv.STAGE_SWITCH_SLEEP, process=WORKER, state=PART),
    Hook("switch.worker_wake_up", "vllm.v1.worker.gpu_worker:Worker.wake_up", _wrap_worker_wake_up,
         stage=semconv.STAGE_LOAD_H2D, process=WORKER, state=PART),
]
