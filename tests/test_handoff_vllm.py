"""The hand-off between EngineCore and its worker, against a real vLLM (CPU build, tiny local
model): the worker is kept from running for a second, from outside the server, just before a
warm request arrives, so EngineCore hands the request's first step to a worker that cannot begin
it. Two means: SIGSTOP/SIGCONT of the worker process, and its cgroup frozen (cgroup v1 freezer,
``FROZEN`` then ``THAWED``; skipped where this container cannot write cgroups). Neither leaves
the worker on a run queue nor inside a step: only the hand-off's two stamps see it. Each time
the request's Prefill names the second as a wait (``prefill.wait``) with the hand-off as its
evidence and no cause readable (``not_runnable``); the requests around it name none."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.replay.server import VllmServer
from tests.export_env import EXPORT_ENV
from tests.test_request_vllm import (
    assert_tiles_ttft,
    by_trace,
    children,
    complete,
    token_prompt,
    wait_for_requests,
)
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

HOLD_S = 1.0
FREEZER = Path("/sys/fs/cgroup/freezer")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def worker_pid(server: VllmServer) -> int:
    """The server's worker process (vLLM titles it ``VLLM::Worker...``)."""
    found = []
    for pid in _descendants(server.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(b"VLLM::Worker"):
            found.append(pid)
    assert len(found) == 1, found
    return found[0]


def _held(server: VllmServer, model: str, hold: Callable[[], None], release: Callable[[], None],
          seed: int):
    """A warm request sent while the worker is held; released ``HOLD_S`` after the hold."""
    hold()
    result: list = []
    thread = threading.Thread(target=lambda: result.append(
        complete(server.url, model, token_prompt(40, seed=seed))))
    thread.start()
    time.sleep(HOLD_S)
    release()
    thread.join(120)
    return result[0]


def _freezer(pid: int) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """Hold, release and clean-up of ``pid`` through a cgroup v1 freezer of its own."""
    group = FREEZER / f"otel-ttft-test-{pid}"
    group.mkdir()
    home = FREEZER / "cgroup.procs"

    def hold():
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")

    def release():
        (group / "freezer.state").write_text("THAWED")
        home.write_text(str(pid))

    def cleanup():
        (group / "freezer.state").write_text("THAWED")
        for task in (group / "cgroup.procs").read_text().split():
            home.write_text(task)
        group.rmdir()
    return hold, release, cleanup


def _can_freeze() -> bool:
    try:
        probe = FREEZER / f"otel-ttft-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _assert_named_wait(spans, req: dict) -> dict:
    parts = assert_tiles_ttft(spans, req)
    prefill = next(p for p in parts if p["name"] == semconv.SPAN_REQUEST_PREFILL)
    waits = [c for c in children(spans, prefill) if c["name"] == semconv.SPAN_PREFILL_WAIT]
    assert len(waits) == 1, [c["name"] for c in children(spans, prefill)]
    (wait,) = waits
    evidence = wait["attributes"]
    handoff = evidence[semconv.ATTR_STEP_HANDOFF_SECONDS]
    assert HOLD_S * 0.7 <= handoff <= HOLD_S * 1.5, evidence
    assert evidence[semconv.ATTR_WAIT_CAUSE] == semconv.WAIT_CAUSE_NOT_RUNNABLE, evidence
    wait_s = (wait["end_ns"] - wait["start_ns"]) / 1e9
    assert wait_s >= handoff * 0.9
    assert prefill["start_ns"] <= wait["start_ns"] <= wait["end_ns"] <= prefill["end_ns"]
    assert req["attributes"][semconv.ATTR_REQUEST_WAIT_SECONDS] >= handoff * 0.9
    return evidence


def test_a_worker_held_before_its_step_is_a_named_wait(receiver, tiny_model, tmp_path):
    model = str(tiny_model)
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_TTFT_REQUEST_DETAIL": semconv.DETAIL_SPANS}
    freeze = _can_freeze()
    with VllmServer(tiny_model, env=env, extra_args=EAGER_ARGS,
                    log_path=tmp_path / "server.log") as server:
        before = [complete(server.url, model, token_prompt(40, seed=i)) for i in range(3)]
        time.sleep(2)  # past vLLM's busy loop: the worker sleeps on its queue, as when idle
        pid = worker_pid(server)
        stopped = _held(server, model, lambda: os.kill(pid, signal.SIGSTOP),
                        lambda: os.kill(pid, signal.SIGCONT), seed=7)
        between = complete(server.url, model, token_prompt(40, seed=8))
        frozen = None
        if freeze:
            hold, release, cleanup = _freezer(pid)
            try:
                time.sleep(2)
                frozen = _held(server, model, hold, release, seed=9)
            finally:
                cleanup()
        after = complete(server.url, model, token_prompt(40, seed=10))
        calls = [*before, stopped, between, *([frozen] if frozen else []), after]
        wait_for_requests(receiver, len(calls))
    spans = receiver.store.spans()
    reqs = by_trace(spans, calls)
    (req,) = reqs[stopped.trace_id]
    _assert_named_wait(spans, req)
    if frozen is not None:
        (req,) = reqs[frozen.trace_id]
        _assert_named_wait(spans, req)
    for call in [*before[1:], between, after]:  # warm and not held: no wait of that size
        (other,) = reqs[call.trace_id]
        assert other["attributes"].get(semconv.ATTR_REQUEST_WAIT_SECONDS, 0.0) < HOLD_S / 2
    if not freeze:
        pytest.skip("SIGSTOP checked; this container cannot write the cgroup v1 freezer")
