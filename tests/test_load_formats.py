"""Load-format readers over vLLM's real iterator functions on the tiny checkpoint (no engine):
vLLM's safetensors reader, threads, torch.load, the Run:ai streamer; storage evidence; the rest of
"Load model"; overlap; the load state's part handed to the hooks and closed by uninstrument."""

from __future__ import annotations

import gc
import inspect
from pathlib import Path

import pytest
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.config import Config
from otel_ttft.runtime.hooks import load as load_family
from otel_ttft.runtime.hooks.load import finish as load_finish
from otel_ttft.runtime.hooks.load import formats as load_formats
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load import storage
from otel_ttft.runtime.hooks.load import weights as load_weights
from otel_ttft.runtime.hooks.registry import HookSet
from otel_ttft.runtime.state import ProcessState
from otel_ttft.tools.analysis.traces import build_trees, self_time_by_stage
from otel_ttft.tools.tiny_model import checkpoint_files

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.fixture
def process_state():
    """The process state ``_instrument`` builds, with the load family's part (and the stage
    metrics it records shard reads into); closed after."""
    from otel_ttft.runtime.state import PartSpec
    from otel_ttft.runtime.telemetry import metrics as stage_metrics

    state = ProcessState(Config(), [PartSpec(stage_metrics.PART, stage_metrics.StageMetrics),
                                    *load_family.PARTS])
    yield state
    state.close()


@pytest.fixture
def load(process_state):
    """The load family's part, as the hooks are handed it."""
    return process_state.part(load_shards.STATE)


@pytest.fixture
def load_hooks(process_state):
    """``load_hooks(*selected)`` applies these hooks with ``process_state``; removed after."""
    applied = []

    def apply(*selected):
        hook_set = HookSet(list(selected), process_state)
        hook_set.apply()
        applied.append(hook_set)

    yield apply
    for hook_set in applied:
        hook_set.remove()


def _pass(load, iterator_fn, reader):
    """Run one weights pass over a real vLLM iterator the way the loader hooks do."""
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as span:
        weights = load.begin(span, reader)
        try:
            tensors = list(iterator_fn())
        finally:
            load.end(weights)
    assert load.running() is None and load.open_shards() == []
    return tensors


def _check_shards(exporter, files, reader):
    (weights,) = _named(exporter, "Load weights")
    shards = _named(exporter, semconv.SPAN_SHARD_READ)
    assert sorted(s.attributes[semconv.ATTR_SHARD_PATH] for s in shards) == sorted(map(str, files))
    assert sorted(s.attributes[semconv.ATTR_SHARD_INDEX] for s in shards) == list(range(len(files)))
    on_disk = sum(Path(f).stat().st_size for f in files)
    assert sum(s.attributes[semconv.ATTR_SHARD_BYTES] for s in shards) == on_disk
    for s in shards:
        assert s.parent.span_id == weights.context.span_id  # reader threads included
        assert s.attributes[semconv.ATTR_LOAD_READER] == reader
        assert s.attributes[semconv.ATTR_READ_SECONDS] > 0
    w = weights.attributes
    assert w[semconv.ATTR_LOAD_BYTES] == on_disk == w[semconv.ATTR_CHECKPOINT_BYTES]
    assert w[semconv.ATTR_LOAD_READER] == reader
    wall_s = (weights.end_time - weights.start_time) / 1e9
    assert 0 < w[semconv.ATTR_LOAD_READ_UNION_SECONDS] <= wall_s
    return weights, shards


def test_threaded_safetensors_shards_from_reader_threads(exporter, load_hooks, load, tiny_model):
    load_hooks(load_formats.LOAD_FILE)
    from vllm.model_executor.model_loader.weight_utils import (
        multi_thread_safetensors_weights_iterator,
    )

    files = [str(f) for f in checkpoint_files(tiny_model)]
    tensors = _pass(load, lambda: multi_thread_safetensors_weights_iterator(files, False, 2),
                    "threads")
    assert tensors
    _check_shards(exporter, files, "threads")


def test_safetensors_reader_one_span_per_open_file(exporter, load_hooks, load, tiny_model):
    """vLLM's own safetensors reader: a span per ``safe_open`` file, in read order, one after
    the other, each with the tensors read from it and its residency before the read."""
    load_hooks(*load_weights.HOOKS)
    from safetensors import safe_open
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    files = [str(f) for f in checkpoint_files(tiny_model)]
    tensors = _pass(load, lambda: safetensors_weights_iterator(files, False), "safe_open")
    assert tensors
    weights, shards = _check_shards(exporter, files, "safe_open")
    shards.sort(key=lambda s: s.attributes[semconv.ATTR_SHARD_INDEX])
    for shard, following in zip(shards, shards[1:], strict=False):
        assert shard.end_time <= following.start_time  # one file open at a time
    for shard in shards:
        with safe_open(shard.attributes[semconv.ATTR_SHARD_PATH], framework="pt") as f:
            assert shard.attributes[semconv.ATTR_SHARD_TENSORS] == len(list(f.keys()))
        assert 0 <= shard.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT] <= 1
        assert shard.attributes[semconv.ATTR_READ_SECONDS] <= (
            shard.end_time - shard.start_time) / 1e9
        assert shard.attributes[semconv.ATTR_LOAD_FORMAT] == "safetensors"
    assert weights.attributes[semconv.ATTR_LOAD_SHARDS] == len(files)


def test_safe_open_outside_vllms_reader_is_left_alone(exporter, load_hooks, tiny_model):
    """A metadata read (or any ``safe_open`` not under the safetensors iterator) passes through:
    no span, and the handle is safetensors' own object, not a proxy."""
    load_hooks(*load_weights.HOOKS)
    import safetensors
    from vllm.model_executor.model_loader import weight_utils

    (first, *_) = checkpoint_files(tiny_model)
    with weight_utils.safe_open(str(first), framework="pt") as f:
        assert type(f) is safetensors.safe_open
        f.get_tensor(next(iter(f.keys())))
    assert not _named(exporter, semconv.SPAN_SHARD_READ)


def test_a_consumer_that_stops_early_leaves_no_span_open(exporter, load_hooks, load,
                                                         tiny_model):
    load_hooks(*load_weights.HOOKS)
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    files = [str(f) for f in checkpoint_files(tiny_model)]
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as span:
        weights = load.begin(span, "safe_open")
        reader = safetensors_weights_iterator(files, False)
        next(reader)
        assert len(load.open_shards()) == 1
        reader.close()
        load.end(weights)
    assert load.open_shards() == []
    (shard,) = _named(exporter, semconv.SPAN_SHARD_READ)
    assert shard.attributes[semconv.ATTR_SHARD_TENSORS] == 1


def test_closing_the_state_ends_the_pass_and_its_open_shard(exporter, load_hooks, process_state,
                                                            load, tiny_model):
    """Uninstrument in the middle of a load: the shard span open ends, the running pass gets
    its totals, and the part lets go of both."""
    load_hooks(*load_weights.HOOKS)
    from vllm.model_executor.model_loader.default_loader import safetensors_weights_iterator

    files = [str(f) for f in checkpoint_files(tiny_model)]
    with trace.get_tracer("vllm").start_as_current_span("Load weights") as span:
        load.begin(span, "safe_open")
        reader = safetensors_weights_iterator(files, False)
        next(reader)
        process_state.close()
        assert load.running() is None and load.open_shards() == []
        (shard,) = _named(exporter, semconv.SPAN_SHARD_READ)
        next(reader)  # vLLM's reader goes on, unharmed
        reader.close()
    (weights,) = _named(exporter, "Load weights")
    assert weights.attributes[semconv.ATTR_LOAD_SHARDS] == 1
    assert weights.attributes[semconv.ATTR_LOAD_BYTES] == shard.attributes[
        semconv.ATTR_SHARD_BYTES]


def test_one_way_in_no_proxy_no_attribute_on_vllms_objects_no_module_state():
    """Issue 53: the load hooks reach vLLM through the registry's wrappers only, and what they
    keep lives in the load state's part."""
    import importlib
    import pkgutil

    from otel_ttft.runtime.hooks.load import pagecache

    for info in pkgutil.iter_modules(load_family.__path__):
        source = inspect.getsource(importlib.import_module(f"{load_family.__name__}.{info.name}"))
        assert "ObjectProxy" not in source and "setattr(" not in source, info.name
        assert "instance._" not in source and "global " not in source, info.name
    assert not hasattr(load_shards, "_current") and not hasattr(pagecache, "_libc")
    assert all(hook.state == load_shards.STATE for hook in load_family.HOOKS)


@pytest.fixture(scope="module")
def bin_files(tiny_model, tmp_path_factory):
    import torch
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("bin")
    files = []
    for i, shard in enumerate(checkpoint_files(tiny_model)):
        files.append(out / f"pytorch_model-{i}.bin")
        torch.save(load_file(shard), files[-1])
    return files


@pytest.mark.parametrize("threaded", [False, True])
def test_pt_checkpoints_read_by_torch_load(exporter, load_hooks, load, bin_files, threaded):
    load_hooks(load_formats.TORCH_LOAD)
    import torch
    from vllm.model_executor.model_loader import weight_utils

    files = [str(f) for f in bin_files]
    if threaded:
        tensors = _pass(load, lambda: weight_utils.multi_thread_pt_weights_iterator(files, False),
                        "threads")
    else:
        tensors = _pass(load, lambda: weight_utils.pt_weights_iterator(files, False),
                        "safe_open")
    assert tensors
    _check_shards(exporter, files, "torch.load")
    exporter.clear()
    torch.load(files[0], weights_only=True)  # outside a weights pass: left alone
    assert not _named(exporter, semconv.SPAN_SHARD_READ)


def test_runai_streamer_files_overlap_and_are_counted_once(exporter, load_hooks, load,
                                                           tiny_model):
    pytest.importorskip("runai_model_streamer")
    load_hooks(load_formats.STREAM_FILES, load_formats.GET_TENSORS)
    from vllm.model_executor.model_loader.weight_utils import runai_safetensors_weights_iterator

    files = [str(f) for f in checkpoint_files(tiny_model)]
    tensors = _pass(load, lambda: runai_safetensors_weights_iterator(files, False),
                    "runai_streamer")
    assert tensors
    weights, shards = _check_shards(exporter, files, "runai_streamer")
    assert len({s.start_time for s in shards}) == 1  # every file is requested at once
    assert sum(s.attributes[semconv.ATTR_SHARD_TENSORS] for s in shards) == len(tensors)
    w = weights.attributes
    spans_sum = sum(s.end_time - s.start_time for s in shards) / 1e9
    assert w[semconv.ATTR_LOAD_READ_UNION_SECONDS] < spans_sum  # they overlap
    assert w[semconv.ATTR_LOAD_READ_AGGREGATE_GB_PER_S] == pytest.approx(
        w[semconv.ATTR_LOAD_BYTES] / w[semconv.ATTR_LOAD_READ_UNION_SECONDS] / 1e9)


def _as_dicts(spans):
    return [{"name": s.name, "trace_id": format(s.context.trace_id, "032x"),
             "span_id": format(s.context.span_id, "016x"),
             "parent_span_id": format(s.parent.span_id, "016x") if s.parent else None,
             "start_ns": s.start_time, "end_ns": s.end_time, "attributes": dict(s.attributes)}
            for s in spans]


def test_overlapping_shards_count_once_in_self_time(exporter):
    """Three shard spans over the same second: load.read gets 1 s, not 3."""
    tracer = trace.get_tracer("t")
    base = 1_000_000_000_000
    root = tracer.start_span("Load weights", start_time=base)
    root.set_attribute(semconv.ATTR_STAGE, semconv.STAGE_LOAD)
    ctx = trace.set_span_in_context(root)
    for i in range(3):
        s = tracer.start_span(semconv.SPAN_SHARD_READ, context=ctx, start_time=base + i * 1000)
        s.set_attribute(semconv.ATTR_STAGE, semconv.STAGE_LOAD_READ)
        s.end(end_time=base + 1_000_000_000)
    root.end(end_time=base + 2_000_000_000)
    (roots,) = build_trees(_as_dicts(exporter.get_finished_spans())).values()
    stages = self_time_by_stage(roots[0])
    assert stages[semconv.STAGE_LOAD_READ] == pytest.approx(1.0)
    assert stages[semconv.STAGE_LOAD] == pytest.approx(1.0)


def test_rest_of_load_model_is_named_only_inside_it(exporter, load_hooks):
    import torch

    load_hooks(*load_finish.HOOKS)
    module = torch.nn.Linear(2, 2)
    gc.collect()
    module.eval()
    assert not exporter.get_finished_spans()  # outside "Load model": untouched
    with trace.get_tracer("vllm").start_as_current_span("Load model"):
        gc.collect()
        assert module.eval() is module
    release = _named(exporter, semconv.SPAN_RELEASE_MEMORY)
    assert [s.attributes[semconv.ATTR_LOAD_RELEASE_CALL] for s in release] == ["gc.collect"]
    assert release[0].attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD
    assert _named(exporter, semconv.SPAN_MODEL_EVAL)


def test_online_quantization_check_is_named(exporter, load_hooks):
    load_hooks(load_finish.QUANT_LOG)
    from vllm.config import VllmConfig
    from vllm.model_executor.model_loader import base_loader

    with trace.get_tracer("vllm").start_as_current_span("Load model"):
        base_loader.log_online_quantization(VllmConfig())
    (span,) = _named(exporter, semconv.SPAN_ONLINE_QUANT_CHECK)
    assert span.attributes[semconv.ATTR_STAGE] == semconv.STAGE_LOAD


def test_storage_evidence(tmp_path):
    assert storage.is_remote("nfs4") and storage.is_remote("fuse.s3fs")
    assert storage.is_remote("ext4") is False and storage.is_remote(None) is None
    f = tmp_path / "x"
    f.write_bytes(b"1")
    found = storage.evidence([str(f)])
    assert found["fs_type"] and isinstance(found["remote"], bool)
    device, rotational = storage.block_device(f)
    assert (device is None) == (rotational is None) or rotational is None
    assert storage.block_device(tmp_path / "missing") == (None, None)
    assert storage.evidence([]) == {}


def test_fastsafetensors_files_from_headers(exporter, load, tiny_model):
    """The fastsafetensors wrapper over a CPU stand-in with the same signature and output (vLLM's
    own safetensors iterator): fastsafetensors itself needs CUDA (scripts/gpu-check runs it)."""
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    from scripts.gpu_check_load import check_fastsafetensors

    files = [str(f) for f in checkpoint_files(tiny_model)]
    tensors = _pass(load, lambda: load_formats._wrap_fastsafetensors(
        load, safetensors_weights_iterator, None, (files, False), {}), "fastsafetensors")
    assert tensors
    weights, shards = _check_shards(exporter, files, "fastsafetensors")
    assert sum(s.attributes[semconv.ATTR_SHARD_TENSORS] for s in shards) == len(tensors)
    assert check_fastsafetensors(_as_dicts(exporter.get_finished_spans()), tiny_model) == []
    assert check_fastsafetensors(_as_dicts([weights]), tiny_model)  # no shards: a problem
