"""Eviction is a span: the outgoing server's side of a model switch.

A restart-style swapper (llama-swap, a systemd unit, a script) stops one vLLM and starts another.
The user's first token waits for that stop: EngineCore and the workers have to exit and give their
memory back before the next model fits. The API process measures it: ``vllm.switch``
(``ttft.stage=switch``) from the SIGTERM/SIGINT until every engine process is gone and the API
process itself reaches its exit (atexit), exported before the process exits. A sleep request
(``/sleep``) is the same eviction without a restart: the API-side ``vllm.switch`` covers it and
EngineCore's "Sleep" [switch.sleep] nests under it.

We chain to vLLM's signal handling, never replace it: once uvicorn listens (vLLM has installed its
loop handlers by then), our Python-level handler notes the time and calls the one it found.

Why a signal handler and not a wrapper through the registry (issue 53 wants one way in): vLLM
handles the stop signal in ``launcher.serve_http`` with a closure registered through
``loop.add_signal_handler``, which no wrapper can reach; the first vLLM function it leads to that
the registry can wrap (``AsyncLLM.shutdown``, from ``handle_shutdown``) runs a loop turn later,
from an executor thread, and knows neither the signal nor that one arrived (it also runs on
errors and at interpreter exit). The signal's arrival, and which signal, are only seen here. The
handler is the ``switch`` part's: closing it puts back, exactly, the handler it found (if ours is
still the one installed; a later handler that chained to ours keeps calling through it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, handoff
from otel_ttft.runtime.hooks.registry import Hook
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_API_SERVER as API_SERVER

logger = logging.getLogger("otel_ttft")

WAIT_S = 120.0  # longest wait for the engine processes; the span says how many were left
POLL_S = 0.01
EXIT_WAIT_S = 10.0  # at interpreter exit, how long the span may still wait for the children
API_EXIT_WAIT_S = 30.0  # engine gone: how long to wait for this process to reach its exit
_SIGNALS = (signal.SIGTERM, signal.SIGINT)

class _Eviction:
    """One ``vllm.switch`` span: the engine processes' exit, then this process reaching its own
    exit (atexit), which is as late as the process can still see and export."""

    def __init__(self, span: trace.Span, procs: list[Any], cfg: config.Config):
        self.span, self.procs, self.config = span, procs, cfg
        self.done = threading.Event()
        self.exiting = threading.Event()
        self.exit_ns: int | None = None
        self._end_lock = threading.Lock()

    def wait_and_end(self, wait_s: float = WAIT_S) -> None:
        start = time.monotonic()
        deadline = start + wait_s
        alive = _alive(self.procs)
        while alive and time.monotonic() < deadline:
            time.sleep(POLL_S)
            alive = _alive(alive)
        gone_ns = clock.now_ns()
        self.span.set_attribute(semconv.ATTR_SWITCH_ENGINE_EXIT_S, time.monotonic() - start)
        # The API process still tears down (HTTP server, engine client): wait for its exit.
        # (vLLM's API process may also reach its exit first: the engine's exit ends the span.)
        exited = self.exiting.wait(API_EXIT_WAIT_S)
        self.end(len(alive), max(gone_ns, self.exit_ns or 0) if exited else gone_ns)

    def end(self, left: int, end_ns: int | None = None) -> None:
        with self._end_lock:
            if self.done.is_set():
                return
            self.span.set_attribute(semconv.ATTR_SWITCH_PROCESSES_LEFT, left)
            self.span.end(end_time=end_ns or clock.now_ns())
            self.done.set()
        flush = getattr(config.tracer_provider(self.config), "force_flush", None)
        if flush is not None:
            # The process is about to exit: the same deadline as every exit flush (issue 11).
            flush(int(self.config.exit_timeout_s * 1000))

    def at_exit(self) -> None:
        """The interpreter is exiting: the span ends now (children permitting), exported."""
        self.exit_ns = clock.now_ns()
        self.exiting.set()
        if not self.done.wait(EXIT_WAIT_S):
            self.end(len(_alive(self.procs)), self.exit_ns)


def engine_processes() -> list[Any]:
    """This process's descendants that hold the engine: EngineCore, workers, their helpers.

    multiprocessing's resource tracker lives as long as we do, so it is not waited for.
    """
    import psutil  # a vLLM dependency; imported only when a switch starts

    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(proc.cmdline())
            if "resource_tracker" not in cmdline:
                found.append(proc)
    return found


def _alive(procs: list[Any]) -> list[Any]:
    """Processes still running; a zombie has exited and freed its memory (never reaped here:
    reaping would steal vLLM's own join)."""
    import psutil

    left = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
    return left


def _resident_bytes(procs: list[Any]) -> int:
    import psutil

    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


class SwitchState:
    """The ``switch`` part: the handlers we chained in front of (``previous``: signal -> the
    handler found there) and this process's eviction, once a stop signal started it. Closing it
    hands each signal back to the handler we found and takes back the eviction's exit handler."""

    def __init__(self, process_state: Any) -> None:
        self.config: config.Config = process_state.config
        self.tracer: trace.Tracer = process_state.tracer
        self.identity = process_state.identity
        self.lock = threading.Lock()
        self.previous: dict[int, Any] = {}
        self.eviction: _Eviction | None = None

    def start_eviction(self, signame: str) -> _Eviction | None:
        """The stop signal arrived: open the span and wait for the engine in a thread (once)."""
        with self.lock:
            if self.eviction is not None or not config.tracing_ready(self.config):
                return None
            start = clock.now_ns()
            procs = engine_processes()
            span = self.tracer.start_span(semconv.SPAN_SWITCH, context=otel_context.Context(),
                                          start_time=start,
                                          attributes={semconv.ATTR_STAGE: semconv.STAGE_SWITCH})
            spans.tag_span(span, semconv.STAGE_SWITCH, {
                semconv.ATTR_SWITCH_REASON: semconv.SWITCH_REASON_SIGNAL,
                semconv.ATTR_SWITCH_SIGNAL: signame,
                semconv.GEN_AI_REQUEST_MODEL: self.identity.served_model,
                semconv.ATTR_SWITCH_PROCESSES: len(procs),
                semconv.ATTR_SWITCH_RELEASED_BYTES: _resident_bytes(procs),
                semconv.PROCESS_PID: os.getpid(),
            }, self.identity)
            self.eviction = eviction = _Eviction(span, procs, self.config)
        threading.Thread(target=eviction.wait_and_end, name="otel-ttft-switch",
                         daemon=True).start()
        atexit.register(eviction.at_exit)  # runs before the SDK's own atexit shutdown (LIFO)
        return eviction

    def _chained(self, previous: Any):
        def handler(signum, frame):
            try:
                self.start_eviction(signal.Signals(signum).name)
            except Exception as exc:  # noqa: BLE001 - ours must never stop vLLM's shutdown
                logger.warning("otel-ttft: switch span not started: %r", exc)
            if callable(previous):
                return previous(signum, frame)
            if previous == signal.SIG_DFL:  # nobody handled it: do what the default would
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return None

        handler.otel_ttft_previous = previous  # type: ignore[attr-defined]
        return handler

    def install_signal_chain(self) -> None:
        """Put our handler in front of whatever handles SIGTERM/SIGINT now (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if getattr(current, "otel_ttft_previous", None) is not None or current is None:
                continue  # already chained, or installed from C (cannot be called from Python)
            self.previous[sig] = current
            signal.signal(sig, self._chained(current))

    def remove_signal_chain(self) -> None:
        """Hand each signal back to the handler we found, if ours is still there (main thread
        only: elsewhere ``signal.signal`` raises, and the chain stays, calling through)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in list(self.previous.items()):
            if getattr(signal.getsignal(sig), "otel_ttft_previous", None) is previous:
                signal.signal(sig, previous)
            del self.previous[sig]

    def close(self) -> None:
        """The signals back to the handlers we found; an eviction still waiting ends now (its
        thread wakes and finds it ended) and its exit handler is taken back."""
        self.remove_signal_chain()
        eviction = self.eviction
        if eviction is not None:
            atexit.unregister(eviction.at_exit)
            if not eviction.done.is_set():
                eviction.span.set_attribute(semconv.ATTR_SPAN_ENDED_BY, "uninstrument")
                eviction.end(len(_alive(eviction.procs)))
            eviction.exiting.set()


PART = "switch"



async def _wrap_uvicorn_startup(switch, call, instance, args, kwargs):
    """uvicorn listens: vLLM's loop handlers are in place, chain ours in front of them."""
    result = await call(*args, **kwargs)
    if config.tracing_ready(switch.config):
        switch.install_signal_chain()
    return result


async def _wrap_api_sleep(switch, call, instance, args, kwargs):
    """``/sleep``: the API side of the eviction; EngineCore's "Sleep" joins it through handoff."""
    if not config.tracing_ready(switch.config):
        return await call(*args, **kwargs)
    level = args[0] if args else kwargs.get("level", 1)
    attrs = {semconv.ATTR_SWITCH_REASON: semconv.SWITCH_REASON_SLEEP,
             semconv.ATTR_SLEEP_LEVEL: int(level),
             semconv.GEN_AI_REQUEST_MODEL: switch.identity.served_model}
    with spans.stage_span(semconv.SPAN_SWITCH, semconv.STAGE_SWITCH, attributes=attrs,
                          context=otel_context.Context(), tracer=switch.tracer,
                          identity=switch.identity), \
            handoff.offered("sleep"):
        return await call(*args, **kwargs)


HOOKS = [
    Hook("switch.on_signal", "uvicorn.server:Server.startup", _wrap_uvicorn_startup,
         stage=semconv.STAGE_SWITCH, process=API_SERVER, state=PART),
    Hook("switch.api_sleep", "vllm.v1.engine.async_llm:AsyncLLM.sleep", _wrap_api_sleep,
         stage=semconv.STAGE_SWITCH, process=API_SERVER, state=PART),
]
