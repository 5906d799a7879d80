"""Uninstrumenting leaves the process as it found it: what the start-up path installs while
instrumented (wrappers on vLLM's real classes, exit handlers, filters on the OpenTelemetry
loggers, signal handlers, the clock's environment variable, before-exit-flush callbacks, watcher
threads, gauge callbacks, descriptors, the process identity our span processors read) is there
once while instrumented, gone after, and there exactly once again after instrument ->
uninstrument -> instrument; spans still open (the activation root, an eviction) are ended, not
left open."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import wrapt
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import clock, config, inflight
from otel_ttft.runtime.hooks import activation, all_hooks, switch
from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
from otel_ttft.runtime.state import ProcessIdentity
from otel_ttft.runtime.telemetry import bounded_export, spans
from otel_ttft.runtime.telemetry import metrics as telemetry_metrics
from tests.otel_memory import memory_exporter

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _wrapped_targets() -> dict[str, int]:
    """Hook target -> how many wrapt layers are on it now, over vLLM's real classes here."""
    found = {}
    for hook in all_hooks():
        try:
            owner = importlib.import_module(hook.module)
            *path, attr = hook.qualname.split(".")
            for name in path:
                owner = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        layers, fn = 0, vars(owner).get(attr)
        while isinstance(fn, wrapt.FunctionWrapper):
            layers, fn = layers + 1, fn.__wrapped__
        found[hook.target] = layers
    return found


_exit_handlers: list = []
"""The exit handlers registered and not taken back since the fixture began (``atexit`` counts
a handler taken back until exit, so registrations are followed instead)."""


def _track_exit_handlers(monkeypatch) -> None:
    register, unregister = atexit.register, atexit.unregister
    _exit_handlers.clear()

    def tracked_register(fn, *args, **kwargs):
        _exit_handlers.append(fn)
        return register(fn, *args, **kwargs)

    def tracked_unregister(fn):
        _exit_handlers[:] = [h for h in _exit_handlers if h != fn]
        return unregister(fn)

    monkeypatch.setattr(atexit, "register", tracked_register)
    monkeypatch.setattr(atexit, "unregister", tracked_unregister)


def _handler(handler: object) -> str:
    """A signal handler, by what it is (``switch(...)``: our chain in front of ``...``)."""
    previous = getattr(handler, "otel_ttft_previous", None)
    if previous is not None:
        return f"switch({_handler(previous)})"
    if getattr(handler, "__name__", None) == "_on_fatal_signal":
        return "inflight fatal"
    return repr(handler) if isinstance(handler, signal.Handlers) else f"other {handler!r}"


_SHORT_LIVED = ("otel-ttft-flush", "otel-ttft-ledger", "otel-ttft-switch")


def _installed(settle: tuple[str, ...] = _SHORT_LIVED) -> dict[str, object]:
    """What the process holds that instrumenting may change."""
    otel_loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                    if n.startswith("opentelemetry.")]
    deadline = time.monotonic() + 3  # short-lived threads (flush, ledger writer) end
    while time.monotonic() < deadline and any(
            t.name in settle for t in threading.enumerate()):
        time.sleep(0.05)
    return {
        "wrappers": _wrapped_targets(),
        "atexit": len(_exit_handlers),
        "logger filters": sum(isinstance(f, bounded_export._OncePerMessage)
                              for log in otel_loggers for f in log.filters),
        "signal handlers": {sig.name: _handler(signal.getsignal(sig)) for sig in _SIGNALS},
        "clock offset env": os.environ.get(clock.OTEL_TTFT_CLOCK_OFFSET),
        "before exit flush": len(bounded_export._Exit.callbacks),
        "exit deadline": bounded_export._Exit.timeout_s,
        "stage listeners": len(spans._stage_listeners),
        "threads": sorted(t.name for t in threading.enumerate()
                          if t.name.startswith("otel-ttft")),
        "gauges registered": len(telemetry_metrics._feeds),
        "gauges fed": sum(feed.source is not None for _, feed in telemetry_metrics._feeds.values()),
        # what the processors of our configurator's provider (which outlive us) read it through
        "identities held": sum(x is not None for x in (inflight.tracker().identity,
                                                        telemetry_metrics.open_part())),
        "fds": len(os.listdir("/proc/self/fd")),
        "compile callbacks": _compile_callbacks(),
    }


def _compile_callbacks() -> tuple[int, object, object]:
    """Dynamo's compile callbacks and Triton's JIT hooks (the worker's, from its first step)."""
    from torch._dynamo.callback import callback_handler
    from triton import knobs

    def name(hook: object) -> str | None:
        return None if hook is None else getattr(hook, "__qualname__", repr(hook))

    return (len(callback_handler.start_callbacks) + len(callback_handler.end_callbacks),
            name(knobs.runtime.jit_cache_hook), name(knobs.runtime.jit_post_compile_hook))


@pytest.fixture
def pristine(monkeypatch):
    exporter = memory_exporter()  # our configurator's provider, as opentelemetry-instrument has
    exporter.clear()
    monkeypatch.delenv(clock.OTEL_TTFT_CLOCK_OFFSET, raising=False)
    _track_exit_handlers(monkeypatch)
    for sig in _SIGNALS:  # the default action, where our fatal-signal handlers go
        monkeypatch.setattr(signal, "_saved_" + sig.name, signal.getsignal(sig), raising=False)
        signal.signal(sig, signal.SIG_DFL)
    instrumentor = VllmTTFTInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    yield instrumentor, exporter
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    for sig in _SIGNALS:
        signal.signal(sig, getattr(signal, "_saved_" + sig.name))


def _use(instrumentor: VllmTTFTInstrumentor) -> None:
    """What a start-up and a stop do to the state: an activation root opened (not yet ready), the
    model noted, the switch chain in front of vLLM's handlers, an eviction begun."""
    state = instrumentor.state
    act = state.part(activation.PART)
    assert act.ensure_root() is not None
    act.note_model(SimpleNamespace(model_config=SimpleNamespace(served_model_name="m")))
    part = state.part(switch.PART)
    part.install_signal_chain()
    assert part.start_eviction("SIGTERM") is not None
    state.part("request.worker")._watch_compiles()  # what a worker's first step registers


def test_uninstrument_takes_back_everything_the_start_up_path_installed(pristine,
                                                                         monkeypatch):
    instrumentor, exporter = pristine
    monkeypatch.setenv("OTEL_TTFT_EXIT_TIMEOUT_MS", "1234")
    before = _installed()
    instrumentor.instrument(skip_dep_check=True)
    _use(instrumentor)
    during = _installed(settle=("otel-ttft-flush", "otel-ttft-ledger"))  # the eviction waits
    changed = {k for k in before if during[k] != before[k]}
    # each of these is installed while instrumented (so the comparison below means something)
    assert {"wrappers", "atexit", "logger filters", "signal handlers", "clock offset env",
            "before exit flush", "exit deadline", "stage listeners", "threads",
            "gauges fed", "compile callbacks", "identities held"} <= changed, changed
    instrumentor.uninstrument()
    after = _installed()
    # a gauge's registration stays with its provider (fed by nothing now: the test below)
    after["gauges registered"] = before["gauges registered"]
    assert {k: (before[k], after[k]) for k in before if after[k] != before[k]} == {}
    # nothing left open: the root and the eviction ended, marked as ended by us
    ended = {s.name: s for s in exporter.get_finished_spans()}
    assert ended[semconv.SPAN_ACTIVATION].attributes[semconv.ATTR_SPAN_ENDED_BY] == "uninstrument"
    assert ended[semconv.SPAN_SWITCH].attributes[semconv.ATTR_SPAN_ENDED_BY] == "uninstrument"
    assert instrumentor.state is None


def test_instrument_again_installs_each_thing_once(pristine, monkeypatch):
    instrumentor, _ = pristine
    monkeypatch.setattr(switch, "API_EXIT_WAIT_S", 0.2)
    instrumentor.instrument(skip_dep_check=True)
    _use(instrumentor)
    first = _installed()
    instrumentor.uninstrument()
    instrumentor.instrument(skip_dep_check=True)
    _use(instrumentor)
    second = _installed()
    assert second == first
    hooks_on = Counter(h.target for h in all_hooks())  # uvicorn's startup: two families
    assert all(layers <= hooks_on[target] for target, layers in second["wrappers"].items())
    # one link of the switch chain, in front of the handler found (ours for SIGTERM: the
    # default action was in place, vLLM's handlers are not, in this test)
    assert second["signal handlers"] == {"SIGTERM": "switch(inflight fatal)",
                                         "SIGINT": f"switch({signal.SIG_DFL!r})",
                                         "SIGHUP": "inflight fatal"}
    instrumentor.uninstrument()
    assert set(_installed()["signal handlers"].values()) == {repr(signal.SIG_DFL)}


def test_a_closed_part_feeds_no_gauge(pristine):
    """The OTel API cannot take a callback back: ours reads the open part, and nothing once it
    is closed; instrumenting again on the same provider registers nothing new."""
    instrumentor, _ = pristine
    instrumentor.instrument(skip_dep_check=True)
    provider = config.meter_provider(instrumentor.state.config)
    # the gauges on this provider (earlier tests' providers keep theirs, fed by nothing)
    feeds = {k: v for k, v in telemetry_metrics._feeds.items() if v[0] is provider}
    # the forecast's gauge is fed from the server's ready on (an earlier test's ready registered
    # it on this provider); every other one from instrumenting on
    at_ready = {semconv.METRIC_SWITCH_FORECAST}
    assert feeds and all(feed.source is not None for (_, name), (_, feed) in feeds.items()
                         if name not in at_ready)
    instrumentor.uninstrument()
    assert all(feed.source is None for _, feed in feeds.values())
    assert all(list(feed(None)) == [] for _, feed in feeds.values())
    registered = dict(telemetry_metrics._feeds)
    instrumentor.instrument(skip_dep_check=True)
    assert telemetry_metrics._feeds == registered  # nothing new
    instrumentor.uninstrument()
    assert instrumentor.state is None


def test_no_process_identity_outlives_its_instrumentation(pristine):
    """Which process this is and its model live in the state: the processors of our
    configurator's provider tag with them while instrumented, and with nothing after; a new
    instrumentation starts blank."""
    instrumentor, exporter = pristine
    instrumentor.instrument(skip_dep_check=True)
    _use(instrumentor)
    state = instrumentor.state
    assert state.identity == ProcessIdentity(semconv.PROCESS_API_SERVER, "m")
    vllm_tracer = trace.get_tracer("vllm.model_executor.model_loader")

    def process_kind_on_vllms_span() -> object:
        exporter.clear()
        vllm_tracer.start_span("Load model").end()
        (span,) = exporter.get_finished_spans()
        assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD  # the tagger ran
        return span.attributes.get(semconv.ATTR_PROCESS_KIND)

    assert process_kind_on_vllms_span() == semconv.PROCESS_API_SERVER
    instrumentor.uninstrument()
    assert process_kind_on_vllms_span() is None
    instrumentor.instrument(skip_dep_check=True)
    assert instrumentor.state.identity == ProcessIdentity()
    assert process_kind_on_vllms_span() is None
    instrumentor.uninstrument()


def test_the_request_instruments_read_the_open_part_after_instrumenting_again(pristine):
    """The request path's observable instruments are fed like every gauge: after instrument ->
    uninstrument -> instrument on one meter provider they report the new part's requests (the
    SDK keeps the first instrument of a name and ignores a second one's callbacks)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    instrumentor, _ = pristine
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    def waiting() -> list[float]:
        data = reader.get_metrics_data()
        return [p.value for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == semconv.METRIC_REQUEST_ARRIVAL_WAITING
                for p in m.data.data_points]

    for queue_depth in (3, 5):
        instrumentor.instrument(skip_dep_check=True, meter_provider=provider)
        metrics = instrumentor.state.part("request.api").emitter.metrics
        metrics.record(0.1, {semconv.STAGE_QUEUE: 0.1}, "m", False, queue_depth, None)
        assert waiting() == [queue_depth]
        instrumentor.uninstrument()
        assert waiting() == []
