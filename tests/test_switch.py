"""Eviction is a span: ``vllm.switch`` from the stop signal until the engine processes are gone.

In-process: the chain in front of an existing handler (it still runs), one span per shutdown.
Against a real vLLM under ``opentelemetry-instrument``: SIGTERM to the API server only (as a
swapper sends it), the span arrives and covers the children's exit; vLLM still shuts down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks import all_parts, switch
from otel_ttft.runtime.state import PartSpec, ProcessState
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.otel_memory import memory_exporter
from tests.request_engine import current_config
from tests.vllm_args import EAGER_ARGS


@pytest.fixture
def fresh_switch(monkeypatch):
    """A ``switch`` part of its own (the process's state as ``_instrument`` makes it)."""
    monkeypatch.setattr(switch, "EXIT_WAIT_S", 0.1)
    monkeypatch.setattr(switch, "API_EXIT_WAIT_S", 0.2)  # no interpreter exit in a test
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    state = ProcessState(current_config(), [PartSpec(switch.PART, switch.SwitchState)])
    yield state.part(switch.PART)
    state.close()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_chained_handler_opens_the_span_and_still_calls_the_previous_one(fresh_switch):
    exporter = memory_exporter()
    exporter.clear()
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    child = subprocess.Popen(  # says, on the host-wide monotonic clock, when it is about to exit
        [sys.executable, "-c", "import time; time.sleep(0.6); print(time.monotonic(), flush=True)"],
        stdout=subprocess.PIPE, text=True)
    try:
        fresh_switch.install_signal_chain()
        fresh_switch.install_signal_chain()  # idempotent: one link, not two
        sent = clock.now_ns()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in the main thread at the next bytecode
        assert seen == [signal.SIGTERM]  # vLLM's own handling still happened
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal: no second span
        exiting = clock.monotonic_to_epoch_ns(float(child.stdout.readline()))
        assert fresh_switch.eviction.done.wait(5)
        child.wait(5)
    finally:
        child.kill()
    assert seen == [signal.SIGTERM, signal.SIGTERM]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_SWITCH]
    attrs = span.attributes
    assert attrs[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH
    assert attrs[semconv.ATTR_SWITCH_REASON] == semconv.SWITCH_REASON_SIGNAL
    assert attrs[semconv.ATTR_SWITCH_SIGNAL] == "SIGTERM"
    assert attrs[semconv.ATTR_SWITCH_PROCESSES] >= 1
    assert attrs[semconv.ATTR_SWITCH_PROCESSES_LEFT] == 0
    assert attrs[semconv.ATTR_SWITCH_RELEASED_BYTES] > 0
    assert 0.3 < attrs[semconv.ATTR_SWITCH_ENGINE_EXIT_S] < (span.end_time - span.start_time) / 1e9
    assert span.parent is None
    assert span.start_time >= sent and span.end_time >= exiting


def test_uninstrument_hands_the_signal_back(fresh_switch):
    def previous(signum, frame):
        pass

    signal.signal(signal.SIGINT, previous)
    fresh_switch.install_signal_chain()
    assert signal.getsignal(signal.SIGINT) is not previous
    fresh_switch.close()
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.vllm
def test_sigterm_to_a_real_vllm_emits_the_switch_span(receiver, tiny_model, tmp_path):
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
    server = VllmServer(tiny_model, env=env, log_path=tmp_path / "server.log",
                        extra_args=(*EAGER_ARGS, "--served-model-name", "tiny-a"))
    server.start()
    try:
        body = json.dumps({"model": "tiny-a", "prompt": "hello", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        children = psutil.Process(server.pid).children(recursive=True)
        # EngineCore and its workers; not the resource tracker
        engine = [p for p in children if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(engine) >= 2  # EngineCore and its worker

        # Watch the children from here, as the span should: last moment any was still alive.
        last_alive = [clock.now_ns()]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                if any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                       for p in engine if _exists(p)):
                    last_alive[0] = clock.now_ns()
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sent = clock.now_ns()
        code = server.stop(60, sig=signal.SIGTERM, group=False)
        stop.set()
        watcher.join()
    finally:
        server.stop()
    assert code == 0, f"vLLM did not exit cleanly on SIGTERM (log: {server.log_path})"
    spans = receiver.wait_for_spans(
        lambda ss: any(s["name"] == semconv.SPAN_SWITCH for s in ss), timeout=30)
    (span,) = [s for s in spans if s["name"] == semconv.SPAN_SWITCH]
    attrs = span["attributes"]
    assert attrs[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH
    assert attrs[semconv.ATTR_SWITCH_SIGNAL] == "SIGTERM"
    assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "tiny-a"
    assert attrs[semconv.ATTR_SWITCH_PROCESSES] >= 2
    assert attrs[semconv.ATTR_SWITCH_PROCESSES_LEFT] == 0
    assert 0 < attrs[semconv.ATTR_SWITCH_ENGINE_EXIT_S] * 1e9 <= span["end_ns"] - span["start_ns"]
    assert attrs[semconv.ATTR_SWITCH_RELEASED_BYTES] > 100 << 20  # two Python+torch processes
    assert span["parent_span_id"] in (None, "")
    assert sent <= span["start_ns"] <= sent + 2_000_000_000
    # It covers the children's exit (within our 10 ms poll and the watcher's 5 ms).
    assert span["end_ns"] >= last_alive[0] - 20_000_000


def _exists(proc: psutil.Process) -> bool:
    try:
        return proc.is_running()
    except psutil.Error:
        return False


class _EngineCoreClient:
    """Stands in for the ZMQ client: runs the real EngineCore.sleep as EngineCore would."""

    def __init__(self, engine):
        self.engine = engine

    async def sleep_async(self, level, mode):
        from vllm.v1.engine.core import EngineCore

        EngineCore.sleep(self.engine, level)


class _Renderer:
    async def clear_mm_cache_async(self):
        pass


@pytest.mark.vllm_import
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_sleep_request_is_one_switch_span_with_engine_sleep_under_it(monkeypatch):
    """Sleep mode is rejected on CPU: the real AsyncLLM.sleep and EngineCore.sleep run around
    stand-ins for the executor and the ZMQ hop (same process, so the parent pid is ours)."""
    import asyncio

    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core import EngineCore

    from otel_ttft.runtime.hooks import sleep
    from otel_ttft.runtime.hooks.registry import HookSet

    exporter = memory_exporter()
    exporter.clear()
    monkeypatch.setattr(os, "getppid", os.getpid)
    hook_set = HookSet([h for h in switch.HOOKS + sleep.HOOKS
                        if h.name in ("switch.api_sleep", "switch.engine_sleep")],
                       ProcessState(current_config(), all_parts()))
    hook_set.apply()
    try:
        calls = []
        engine = EngineCore.__new__(EngineCore)
        engine.model_executor = type("Executor", (), {
            "is_sleeping": False, "sleep": lambda self, level: calls.append(level)})()
        engine.pause_scheduler = lambda mode, clear_cache: None
        llm = AsyncLLM.__new__(AsyncLLM)
        llm.renderer, llm.engine_core, llm.logger_manager = (
            _Renderer(), _EngineCoreClient(engine), None)
        llm.shutdown = lambda timeout=None: None  # its __del__ would tear down what is not there
        asyncio.run(AsyncLLM.sleep(llm, 1))
    finally:
        hook_set.remove()
        hook_set.state.close()
    assert calls == [1]
    spans = exporter.get_finished_spans()
    (evict,) = [s for s in spans if s.name == semconv.SPAN_SWITCH]
    (sleep,) = [s for s in spans if s.name == semconv.SPAN_SLEEP]
    assert evict.attributes[semconv.ATTR_SWITCH_REASON] == semconv.SWITCH_REASON_SLEEP
    assert evict.attributes[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH
    assert evict.attributes[semconv.ATTR_SLEEP_LEVEL] == 1
    assert evict.parent is None  # its own trace, like the signal case
    assert sleep.parent.span_id == evict.context.span_id  # no second switch span, a child
    assert sleep.attributes[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH_SLEEP
