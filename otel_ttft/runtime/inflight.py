"""Activation spans still open in this process: what a hang or a crash would otherwise hide.

Spans are exported when they end, so a start-up that hangs shows nothing and one that dies loses
its open spans. This module keeps the open activation spans of the process and uses them to:

- report ``ttft.activation.stage.in_progress`` (an observable gauge: the innermost open stage and
  how long it has been open), so an alert can fire while the start-up still hangs;
- export a snapshot copy of every open span (``ttft.span.unfinished=true``, same span id) once a
  stage has been open for ``OTEL_TTFT_SNAPSHOT_AFTER_S``, so ``otel-ttft tree`` shows the
  unfinished activation; the real span, exported later, replaces the copy in the store;
- publish the open chain to a small file per pid (``state_files``), so a parent can end a
  child's spans when the child is killed (SIGKILL leaves the child no chance: ``hooks.fault``);
- end what is still open, with an error, when the process exits or gets a fatal signal, and
  remember the stage the activation failed in (one file per trace: the first failure wins).

Snapshots and a dead child's spans go straight to the exporting processors of our configurator's
provider (``send``); with a provider we did not build there are none, and only the gauge, the
published chain and the end at exit remain.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanContext, Status, StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, state_files
from otel_ttft.runtime.telemetry import bounded_export, spans
from otel_ttft.runtime.telemetry import metrics as telemetry_metrics

if TYPE_CHECKING:
    from otel_ttft.runtime.state import ProcessIdentity

logger = logging.getLogger("otel_ttft")

# Spans that belong to an activation: vLLM's start-up spans and ours. Matched by name, one set
# lookup per span start, so request-path spans cost nothing here.
ACTIVATION_SPAN_NAMES = frozenset({
    *semconv.VLLM_SPAN_STAGES, semconv.SPAN_ACTIVATION, semconv.SPAN_FRONTEND_SETUP,
    semconv.SPAN_ENGINE_CONFIG, semconv.SPAN_ENGINE_CLIENT, semconv.SPAN_SHARD_READ,
    semconv.SPAN_PROCESS_WEIGHTS, semconv.SPAN_DEVICE_INIT,
    semconv.SPAN_PROFILE_RUN, semconv.SPAN_TORCH_COMPILE, semconv.SPAN_SLEEP,
    semconv.SPAN_WAKE_UP, semconv.SPAN_ADAPTER_LOAD,
})
_ACTIVATION_FAMILIES = (semconv.STAGE_SWITCH, semconv.STAGE_LOAD, semconv.STAGE_WARMUP)


def span_stage(span: Any) -> str | None:
    stage = (getattr(span, "attributes", None) or {}).get(semconv.ATTR_STAGE)
    if isinstance(stage, str) and stage:
        return stage
    return semconv.VLLM_SPAN_STAGES.get(getattr(span, "name", ""))


def is_activation_stage(stage: str | None) -> bool:
    return stage is not None and semconv.stage_family(stage) in _ACTIVATION_FAMILIES


class InflightTracker(SpanProcessor):
    """Keeps this process's open activation spans (SDK spans, by span id). Ahead of every
    exporting processor on our configurator's provider: a span's end reaches it first, and waits
    for a snapshot being sent (``export_snapshot``), so a snapshot is never queued after the span
    it copies. ``identity``: the open instrumentation's process identity (set and taken back by
    the ``inflight`` part), named in the published chain and a recorded failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sending = threading.Lock()  # held while snapshots are queued
        self._open: dict[int, Any] = {}
        self._publish = True
        self.identity: ProcessIdentity | None = None

    def kind(self) -> str | None:
        return self.identity.kind if self.identity is not None else None

    # --- SpanProcessor ----------------------------------------------------------------------------
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if span.name not in ACTIVATION_SPAN_NAMES or not span.is_recording():
            return
        with self._lock:
            self._open[span.get_span_context().span_id] = span
        self.publish()

    def restaged(self, span: Any) -> None:
        """A tracked span got its stage after it started: the published chain must say it."""
        if getattr(span, "name", None) in ACTIVATION_SPAN_NAMES \
                and getattr(span, "end_time", 0) is None:
            self.publish()

    def on_end(self, span: ReadableSpan) -> None:
        if span.name not in ACTIVATION_SPAN_NAMES:
            return
        with self.sending, self._lock:
            found = self._open.pop(span.context.span_id, None)
        if found is None:
            return
        if span.status.status_code is StatusCode.ERROR:
            stage = span_stage(span)
            if is_activation_stage(stage):  # the innermost span ends first: it names the stage
                record_failure(span.context, stage, span.name, str(span.status.description or ""),
                               self.kind())
        self.publish()

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # --- queries ----------------------------------------------------------------------------------
    def open_spans(self) -> list[Any]:
        """Open activation spans, outermost first: in the order they were opened, which nesting
        keeps, not by start time (a span may carry a start taken elsewhere: the process's exec,
        another party's clock)."""
        with self._lock:
            return [s for s in self._open.values() if s.end_time is None]

    def innermost(self) -> Any | None:
        """The most recently opened span that names an activation stage."""
        for span in reversed(self.open_spans()):
            if is_activation_stage(span_stage(span)):
                return span
        return None

    # --- the open chain, for a parent that outlives us --------------------------------------------
    def publish(self) -> None:
        if not self._publish:
            return
        chain = [_describe(s) for s in self.open_spans()]
        path = state_files.open_chain_path(os.getpid())
        try:
            if not chain:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                return
            identity = self.identity
            state_files.write_atomic(path, {
                "process_kind": self.kind(), "open": chain,
                "model": identity.served_model if identity is not None else None})
        except OSError:
            self._publish = False  # no writable state dir: stop trying


def _describe(span: Any) -> dict:
    ctx = span.get_span_context()
    parent = span.parent
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "parent_span_id": f"{parent.span_id:016x}" if parent else None,
            "start_ns": span.start_time, "stage": span_stage(span),
            "attributes": {k: v for k, v in (span.attributes or {}).items()
                           if isinstance(v, (str, bool, int, float))}}


# --- the tracker our configurator puts on the provider it builds ---
_tracker: InflightTracker | None = None
"""Lives as long as that provider (not an instrumentation): made once by ``install``. The
watchers around it are the ``inflight`` part of the process's state (``InflightWatch``)."""
_install_lock = threading.Lock()


def tracker() -> InflightTracker | None:
    return _tracker


def install() -> InflightTracker:
    """This process's tracker, made once; our configurator adds it to the provider it builds,
    ahead of any exporting processor. What watches it starts with the instrumentation."""
    global _tracker
    with _install_lock:
        if _tracker is not None:
            return _tracker
        _tracker = InflightTracker()
        # vLLM opened its process's outer span ("Worker init", "EngineCoreProc init") before
        # plugins load: adopt it, so the open chain reaches the parent process's span.
        current = trace.get_current_span()
        if current.is_recording() and getattr(current, "name", None) in ACTIVATION_SPAN_NAMES:
            _tracker.on_start(current)
    state_files.remove_stale()
    return _tracker


class InflightWatch:
    """The ``inflight`` part: what watches the tracker while we are instrumented. The
    in-progress gauge, the snapshot thread, the end of open spans before the exit flush and at a
    fatal signal, and the removal of the published chain at exit. Closing it takes each back:
    the gauge yields nothing, the thread stops, the handlers we set are put back.

    The fatal-signal handlers are set only where the default action (die silently) is in place:
    a handler that vLLM or anyone else installed turns the signal into an exception, and the exit
    path ends our spans; without one, no wrapper of a vLLM function runs before the process dies,
    so a handler is the only way to end the open spans (and they are taken back exactly)."""

    def __init__(self, process_state: Any) -> None:
        self.config: config.Config = process_state.config
        self.identity = process_state.identity
        self.tracker = _tracker  # none: our configurator did not build the provider
        self.stop = threading.Event()
        self.snapshots: threading.Thread | None = None
        self.fatal_handlers: dict[int, Any] = {}  # signal -> the handler (SIG_DFL) we replaced
        self.gauge: telemetry_metrics.GaugeFeed | None = None
        if self.tracker is None:
            return
        self.tracker.identity = self.identity
        self.gauge = telemetry_metrics.observable(
            self.config, semconv.METRIC_ACTIVATION_STAGE_IN_PROGRESS, self.observe, unit="s",
            description="Seconds this process has been in the activation stage it is in now "
                        "(reported only while a start-up, wake-up or adapter load is running)")
        self.snapshots = threading.Thread(target=self._snapshot_loop, name="otel-ttft-snapshot",
                                          daemon=True)
        self.snapshots.start()
        self._install_fatal_signal_handlers()
        spans.listen_for_stages(self.tracker.restaged)
        bounded_export.before_exit_flush(self.end_open_at_exit)
        atexit.register(self.forget_published)

    def close(self) -> None:
        if self.tracker is None:
            return
        atexit.unregister(self.forget_published)
        bounded_export.forget_before_exit_flush(self.end_open_at_exit)
        spans.stop_listening_for_stages(self.tracker.restaged)
        self._restore_fatal_signal_handlers()
        self.stop.set()
        if self.snapshots is not None and self.snapshots is not threading.current_thread():
            self.snapshots.join(5)
        if self.gauge is not None:
            telemetry_metrics.stop_feeding(self.gauge, self.observe)
        if self.tracker.identity is self.identity:
            self.tracker.identity = None

    def end_open_at_exit(self) -> None:
        end_open_spans("process exited before the activation finished", "process_exit")

    def forget_published(self) -> None:
        self.tracker._publish = False
        with contextlib.suppress(OSError):
            state_files.open_chain_path(os.getpid()).unlink()

    # --- the in-progress gauge ---
    def observe(self, _options: Any = None) -> list[metrics.Observation]:
        span = self.tracker.innermost()
        if span is None:
            return []
        attrs = {semconv.ATTR_STAGE: span_stage(span)}
        if self.identity.served_model:
            attrs[semconv.GEN_AI_REQUEST_MODEL] = self.identity.served_model
        if self.identity.kind:
            attrs[semconv.ATTR_PROCESS_KIND] = self.identity.kind
        return [metrics.Observation((clock.now_ns() - span.start_time) / 1e9, attrs)]

    # --- snapshots on a deadline ---
    def _snapshot_loop(self) -> None:
        last = 0.0
        after = self.config.snapshot_after_s
        while not self.stop.wait(min(max(after / 2, 0.2), 5.0) if after > 0 else 5.0):
            if after <= 0:
                continue
            try:
                span = self.tracker.innermost()
                if span is None:
                    continue
                now = time.monotonic()
                held = (clock.now_ns() - span.start_time) / 1e9
                if held >= after and now - last >= after:
                    last = now
                    if export_snapshot():
                        spans.flush_async(self.config)
            except Exception:  # noqa: BLE001 - a watcher must never take the process down
                logger.debug("otel-ttft snapshot failed", exc_info=True)

    # --- fatal signals with no handler ---
    def _install_fatal_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in _FATAL:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is signal.SIG_DFL:
                    signal.signal(sig, self._on_fatal_signal)
                    self.fatal_handlers[sig] = signal.SIG_DFL

    def _restore_fatal_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in list(self.fatal_handlers.items()):
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) == self._on_fatal_signal:
                    signal.signal(sig, previous)
            del self.fatal_handlers[sig]

    def _on_fatal_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        try:
            end_open_spans(f"process received {name}", name)
            bounded_export.bounded_exit()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


PART = "inflight"
_FATAL = ("SIGTERM", "SIGHUP")


def send(readable: ReadableSpan) -> None:
    """Straight to the processors that export (our configurator's; none for another provider)."""
    for proc in bounded_export.exporting_processors():
        with contextlib.suppress(Exception):
            proc.on_end(readable)


def export_snapshot() -> int:
    """A finished copy of every open activation span, marked unfinished; returns how many.

    Queued while holding the tracker's ``sending`` lock, which a span's end takes before it
    reaches the exporting processors: the real span is always queued after its copy (stores
    keep the last copy)."""
    if _tracker is None or not bounded_export.exporting_processors():
        return 0
    now = clock.now_ns()
    sent = 0
    with _tracker.sending:
        for span in _tracker.open_spans():
            if span.end_time is not None:
                continue
            send(ReadableSpan(
                name=span.name, context=span.get_span_context(), parent=span.parent,
                resource=span.resource,
                attributes={**(span.attributes or {}), semconv.ATTR_SPAN_UNFINISHED: True},
                events=span.events, links=span.links, kind=span.kind, status=span.status,
                start_time=span.start_time, end_time=now,
                instrumentation_scope=span.instrumentation_scope))
            sent += 1
    return sent


# --- ending what is still open ---
def end_open_spans(reason: str, ended_by: str) -> int:
    """End every open activation span of this process with an error; innermost first."""
    if _tracker is None:
        return 0
    open_spans = _tracker.open_spans()
    inner = _tracker.innermost()
    stage = span_stage(inner) if inner is not None else None
    if inner is not None:
        record_failure(inner.get_span_context(), stage, inner.name, reason, _tracker.kind())
    for span in reversed(open_spans):
        with contextlib.suppress(Exception):
            span.set_attribute(semconv.ATTR_SPAN_ENDED_BY, ended_by)
            if span.name == semconv.SPAN_ACTIVATION:
                span.set_attribute(semconv.ATTR_ACTIVATION_READY, False)
                if stage:
                    span.set_attribute(semconv.ATTR_ACTIVATION_FAILED_STAGE, stage)
            span.set_status(Status(StatusCode.ERROR, reason))
            span.end(end_time=clock.now_ns())
    return len(open_spans)


# --- the stage an activation failed in, shared by its processes ---
def record_failure(context: SpanContext, stage: str | None, span_name: str, reason: str,
                   process_kind: str | None) -> None:
    """First failure of a trace wins: the deepest error is seen first, in whichever process."""
    if stage and context is not None and context.is_valid:
        state_files.record_failure(context.trace_id, {
            "stage": stage, "span": span_name, "pid": os.getpid(),
            "process_kind": process_kind, "reason": reason[:500]})
