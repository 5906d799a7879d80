"""Disk time apart from the copy (issue 55): safetensors hands out tensors that view its memory
map, so on a cold page cache the storage reads happen as page faults wherever the tensor is first
touched, which in vLLM is the copy into the parameters (host-to-device on a GPU). vLLM's real
reader over an evicted checkpoint: each tensor must reach the consumer with its pages already
read (``mincore`` on the tensor's own memory), those bytes on the shard's span, the file cached
after its read."""

from __future__ import annotations

import ctypes
import mmap

import pytest
import torch
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.config import Config
from otel_ttft.runtime.hooks import load as load_family
from otel_ttft.runtime.hooks.load import pagecache
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load import weights as load_weights
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.state import PartSpec, ProcessState
from otel_ttft.runtime.telemetry import metrics as stage_metrics

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

MIB = 1 << 20
TENSORS = 4


@pytest.fixture
def load():
    """The load family's part of a process state, its hooks applied; both undone after."""
    state = ProcessState(Config(), [PartSpec(stage_metrics.PART, stage_metrics.StageMetrics),
                                    *load_family.PARTS])
    hook_set = HookSet(list(load_weights.HOOKS), state)
    hook_set.apply()
    yield state.part(load_shards.STATE)
    hook_set.remove()
    state.close()


@pytest.fixture
def cold_checkpoint(tmp_path):
    """A 128 MiB shard of four 32 MiB tensors, out of the page cache (larger than the kernel's
    readahead: this machine's disk reads 8 MiB ahead)."""
    from safetensors.torch import save_file

    path = tmp_path / "model-00001-of-00001.safetensors"
    save_file({f"w{i}": torch.randn(8 * MIB) for i in range(TENSORS)}, str(path))
    if pagecache.filesystem_type(path) == "tmpfs":
        pytest.skip("tmpfs pages cannot be evicted")
    assert pagecache.evict(path) and pagecache.resident_ratio(path) == 0.0
    return path


def _missing_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's memory not in memory now (the kernel's own answer)."""
    ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    start = ptr & ~(mmap.PAGESIZE - 1)
    length = ptr + nbytes - start
    vec = (ctypes.c_ubyte * ((length + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    assert pagecache.open_libc().mincore(start, length, vec) == 0
    return bytes(vec).count(0) * mmap.PAGESIZE


def test_a_cold_tensor_reaches_the_copy_already_read(exporter, load, cold_checkpoint):
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    missing_at_copy, copied = [], 0
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as span:
        weights = load.begin(span, "safe_open")
        for _, tensor in safetensors_weights_iterator([str(cold_checkpoint)], False):
            missing_at_copy.append(_missing_bytes(tensor))  # what the copy would fault in
            copied += int(torch.empty_like(tensor).copy_(tensor).numel()) * 4
        load.end(weights)
    assert copied == TENSORS * 32 * MIB
    assert missing_at_copy == [0] * TENSORS  # no storage read left for the copy to do
    (shard,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_SHARD_READ]
    attrs = shard.attributes
    assert attrs[semconv.ATTR_PAGE_CACHE_RESIDENT] == 0.0
    assert attrs[semconv.ATTR_PAGE_CACHE_RESIDENT_AFTER] == 1.0
    # what the reader left unread and we read (readahead brought the rest)
    assert 0 < attrs[semconv.ATTR_LOAD_FAULTED_BYTES] <= copied
    (outer,) = [s for s in exporter.get_finished_spans() if s.name == "Load weights"]
    assert outer.attributes[semconv.ATTR_LOAD_FAULTED_BYTES] == attrs[
        semconv.ATTR_LOAD_FAULTED_BYTES]
    assert outer.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT_AFTER] == 1.0


def test_a_warm_checkpoint_faults_nothing_in(exporter, load, cold_checkpoint):
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    cold_checkpoint.read_bytes()  # cached now
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as span:
        weights = load.begin(span, "safe_open")
        assert len(list(safetensors_weights_iterator([str(cold_checkpoint)], False))) == TENSORS
        load.end(weights)
    (shard,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_SHARD_READ]
    a = shard.attributes
    # cached just before (other processes on this machine may push a few pages out meanwhile):
    # only what was not cached is read, a page per tensor at most besides
    assert a[semconv.ATTR_PAGE_CACHE_RESIDENT] >= 0.99
    uncached = (1 - a[semconv.ATTR_PAGE_CACHE_RESIDENT]) * a[semconv.ATTR_SHARD_BYTES]
    assert a[semconv.ATTR_LOAD_FAULTED_BYTES] <= uncached + 4096 * TENSORS


def test_fault_in_leaves_device_and_empty_tensors_alone():
    libc = pagecache.open_libc()
    assert pagecache.fault_in(torch.empty(0), libc) == 0
    assert pagecache.fault_in(torch.ones(4 * MIB // 4), libc) == 0  # anonymous, written: in
    assert pagecache.fault_in(object(), libc) == 0
