"""Sleep and wake with several workers (issue 55), on vLLM's real classes: ``AsyncLLM.sleep``,
``EngineCore.sleep`` (draining an in-flight request first, so the executor sleeps later, from a
callback), the multiprocess executor's ``sleep``/``collective_rpc``, the GPU worker's ``sleep``,
``wake_up`` and ``discard``, and the sleep allocator ``CuMemAllocator``.

Sleep mode cannot run on a CPU; what is faked is the CUDA part and the process boundary only:
the allocator's map/unmap and ``cudaMemcpy`` (a memmove between host buffers standing for device
memory), torch's accelerator calls, and the executor's message queues, which run the message in
each "worker" with no trace context but what the call carries and with EngineCore, not the API
process, as its parent (``os.getppid``).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch
from opentelemetry import context as otel_context

from otel_ttft import semconv
from otel_ttft.runtime.hooks import activation, rpc, sleep, switch

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKERS = 2
ENGINE_PID = 4_000_037  # the workers' parent: no hand-off file is named by it
SIZES = {"weights": 3 * 4096, "kv_cache": 5 * 4096}


class _Device:
    """Host buffers standing for device allocations, and the CUDA calls vLLM makes on them."""

    def __init__(self):
        self.buffers = {}

    def allocate(self, tag: str, fill: int):
        from vllm.device_allocator import AllocationData

        buf = (ctypes.c_ubyte * SIZES[tag])(*([fill] * SIZES[tag]))
        ptr = ctypes.addressof(buf)
        self.buffers[ptr] = buf
        return ptr, AllocationData(handle=(0, SIZES[tag], ptr, 0), tag=tag)

    def cudaMemcpy(self, dst, src, size):  # noqa: N802 - vLLM's CudaRTLibrary method
        ctypes.memmove(dst, src, size)

    def unmap(self, device, size, ptr, handle):
        ctypes.memset(ptr, 0, size)  # the memory is gone: what comes back must be copied back

    def map(self, device, size, ptr, handle):
        pass


@pytest.fixture
def device(monkeypatch):
    from vllm.device_allocator import cumem

    dev = _Device()
    monkeypatch.setattr(cumem, "libcudart", dev)
    monkeypatch.setattr(cumem, "python_unmap_and_release", dev.unmap)
    monkeypatch.setattr(cumem, "python_create_and_map", dev.map)
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.accelerator, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (1 << 30, 1 << 31))
    return dev


class _Backend:
    """vLLM's CuMemBackend, built on this worker's allocator (vLLM's is a process singleton)."""

    def __init__(self, allocator):
        from vllm.device_allocator.sleep_mode_backend import CuMemBackend

        self.backend, self.allocator = CuMemBackend(), allocator

    def __getattr__(self, name):
        import vllm.device_allocator as package

        real = getattr(self.backend, name)

        def call(*args, **kwargs):  # vLLM's backend asks the package for the allocator
            original = package.get_mem_allocator_instance
            package.get_mem_allocator_instance = lambda: self.allocator
            try:
                return real(*args, **kwargs)
            finally:
                package.get_mem_allocator_instance = original
        return call


def _worker(device, fill):
    from vllm.device_allocator.cumem import CuMemAllocator
    from vllm.v1.worker.gpu_worker import Worker

    allocator = object.__new__(CuMemAllocator)
    allocator.pointer_to_data = dict(device.allocate(tag, fill) for tag in SIZES)
    worker = object.__new__(Worker)
    worker.vllm_config = SimpleNamespace(model_config=SimpleNamespace(
        enable_nccl_comm_suspend=False))
    worker._sleep_mode_backend = _Backend(allocator)
    worker._sleep_saved_parameters, worker._sleep_saved_buffers = {}, {}
    worker._sleep_saved_draft_buffers = {}
    worker.synchronize_device = lambda: None
    return worker, allocator


class _Queue:
    """The executor's broadcast queue: each worker runs the message as its process would."""

    def __init__(self, workers, in_worker):
        self.workers, self.in_worker, self.replies = workers, in_worker, deque()

    def enqueue(self, message):
        import cloudpickle
        from vllm.v1.serial_utils import run_method

        method, args, kwargs, _ = message
        method = cloudpickle.loads(method) if isinstance(method, bytes) else method
        for worker in self.workers:
            token = otel_context.attach(otel_context.Context())  # another process
            self.in_worker[0] = True
            try:
                self.replies.append(run_method(worker, method, args, kwargs))
            finally:
                self.in_worker[0] = False
                otel_context.detach(token)

    def dequeue(self, timeout=None):
        from vllm.v1.executor.multiproc_executor import WorkerProc

        return WorkerProc.ResponseStatus.SUCCESS, self.replies.popleft()


def _executor(workers, in_worker):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    executor = object.__new__(MultiprocExecutor)
    queue = _Queue(workers, in_worker)
    executor.rpc_broadcast_mq, executor.response_mqs = queue, [queue] * len(workers)
    executor.futures_queue, executor.is_failed, executor.sleeping_tags = deque(), False, set()
    return executor


class _Client:
    """The ZMQ hop from the API process to EngineCore: the real EngineCore methods, called."""

    def __init__(self, engine):
        self.engine = engine

    async def sleep_async(self, level, mode):
        from vllm.v1.engine.core import EngineCore

        self.result = EngineCore.sleep(self.engine, level)

    async def release_kv_cache_memory_async(self):
        from vllm.v1.engine.core import EngineCore

        EngineCore.release_kv_cache_memory(self.engine)


@pytest.fixture
def server(device, hooks, monkeypatch):
    """An API process, its EngineCore and two workers, hooked as a real server is."""
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core import EngineCore

    in_worker = [False]
    api_pid = os.getpid()
    monkeypatch.setattr(os, "getppid", lambda: ENGINE_PID if in_worker[0] else api_pid)
    hooks(*switch.HOOKS, *sleep.HOOKS, *rpc.HOOKS,
          *[h for h in activation.HOOKS if h.name.startswith("switch.")])
    workers = [_worker(device, fill=7 + i) for i in range(WORKERS)]
    engine = EngineCore.__new__(EngineCore)
    engine.model_executor = _executor([w for w, _ in workers], in_worker)
    engine.pause = Future()
    engine.pause_scheduler = lambda mode, clear_cache: engine.pause
    llm = AsyncLLM.__new__(AsyncLLM)
    llm.renderer = SimpleNamespace(clear_mm_cache_async=_nothing)
    llm.engine_core, llm.logger_manager = _Client(engine), None
    llm.shutdown = lambda timeout=None: None
    return SimpleNamespace(llm=llm, engine=engine, workers=workers)


async def _nothing():
    return None


def _named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_every_workers_sleep_sits_under_its_switch_with_its_bytes(server, exporter):
    from vllm.v1.engine.async_llm import AsyncLLM

    asyncio.run(AsyncLLM.sleep(server.llm, 1))
    assert not _named(exporter, semconv.SPAN_SLEEP)  # an in-flight request is draining
    server.engine.pause.set_result(None)  # drained: vLLM puts the executor to sleep now
    (evict,) = _named(exporter, semconv.SPAN_SWITCH)
    engine_sleep = [s for s in _named(exporter, semconv.SPAN_SLEEP)
                    if s.parent.span_id == evict.context.span_id]
    assert len(engine_sleep) == 1
    worker_sleeps = [s for s in _named(exporter, semconv.SPAN_SLEEP)
                     if s.parent.span_id == engine_sleep[0].context.span_id]
    assert len(worker_sleeps) == WORKERS  # none an orphan root
    assert {s.context.trace_id for s in _named(exporter, semconv.SPAN_SLEEP)} == {
        evict.context.trace_id}
    for span in worker_sleeps:
        assert span.attributes[semconv.ATTR_SLEEP_LEVEL] == 1
        assert span.attributes[semconv.ATTR_SLEEP_OFFLOADED_BYTES] == SIZES["weights"]
        assert span.attributes[semconv.ATTR_SLEEP_RELEASED_BYTES] == sum(SIZES.values())
    for _, allocator in server.workers:  # what vLLM's allocator holds: the weights on the host
        kept = [d for d in allocator.pointer_to_data.values() if d.cpu_backup_tensor is not None]
        assert [d.tag for d in kept] == ["weights"] and all(d.is_asleep for d in kept)


def test_wake_up_records_the_bytes_copied_back(server, exporter):
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.worker.gpu_worker import Worker

    server.engine.pause.set_result(None)
    asyncio.run(AsyncLLM.sleep(server.llm, 1))
    for worker, allocator in server.workers:
        Worker.wake_up(worker, None)
        weights = next(p for p, d in allocator.pointer_to_data.items() if d.tag == "weights")
        assert set(bytes((ctypes.c_ubyte * SIZES["weights"]).from_address(weights))) == {
            7 + server.workers.index((worker, allocator))}  # the copy really came back
    wakes = _named(exporter, semconv.SPAN_WAKE_UP)
    assert len(wakes) == WORKERS
    for span in wakes:
        assert span.attributes[semconv.ATTR_WAKE_RESTORED_BYTES] == SIZES["weights"]
        assert span.attributes[semconv.ATTR_WAKE_MAPPED_BYTES] == sum(SIZES.values())


def test_level_0_pauses_only_and_ends_when_the_pause_completes(server, exporter):
    from vllm.v1.engine.async_llm import AsyncLLM

    asyncio.run(AsyncLLM.sleep(server.llm, 0))
    assert not _named(exporter, semconv.SPAN_SLEEP)
    server.engine.pause.set_result(None)
    (engine_sleep,) = _named(exporter, semconv.SPAN_SLEEP)  # no worker sleeps at level 0
    assert engine_sleep.attributes[semconv.ATTR_SLEEP_LEVEL] == 0
    (evict,) = _named(exporter, semconv.SPAN_SWITCH)
    assert engine_sleep.parent.span_id == evict.context.span_id
    assert evict.attributes[semconv.ATTR_SLEEP_LEVEL] == 0


def test_releasing_the_kv_cache_is_a_switch_with_each_workers_discard(server, exporter):
    from vllm.v1.engine.async_llm import AsyncLLM

    server.engine.is_scheduler_paused = lambda: True
    server.engine.scheduler = SimpleNamespace(has_requests=lambda: False)
    server.engine.batch_queue = None
    server.engine._reset_caches = lambda: None
    asyncio.run(AsyncLLM.release_kv_cache_memory(server.llm))
    (evict,) = _named(exporter, semconv.SPAN_SWITCH)
    assert evict.attributes[semconv.ATTR_SWITCH_REASON] == semconv.SWITCH_REASON_RELEASE_KV
    (release,) = _named(exporter, semconv.SPAN_RELEASE_KV)
    assert release.parent.span_id == evict.context.span_id
    discards = _named(exporter, semconv.SPAN_DISCARD)
    assert len(discards) == WORKERS
    for span in discards:
        assert span.parent.span_id == release.context.span_id
        assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_SWITCH_SLEEP
        assert span.attributes[semconv.ATTR_SLEEP_RELEASED_BYTES] == SIZES["kv_cache"]
