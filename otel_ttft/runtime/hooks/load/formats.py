"""Shard reads of the load formats other than the default single-threaded safetensors reader.

- multi-threaded safetensors (``enable_multithread_load``): each ``load_file`` in a reader thread
  is one shard span; they overlap.
- PyTorch ``.bin``/``.pt`` (both iterators): each ``torch.load`` of a checkpoint file during a
  weights pass is one shard span; outside a pass ``torch.load`` is left alone.
- ``runai_streamer``: the streamer reads every file at once in its own threads; a file's span runs
  from ``stream_files`` to the delivery of its last tensor, so spans overlap.
- ``fastsafetensors`` (CUDA only): like the streamer, a file's span runs from the loader's start
  to its last tensor; which file a tensor came from is read from the safetensors headers.
- ``sharded_state``: vLLM reads its files one after another; we hand its iterator one file at a
  time, so each file's reads are one span.
Loaders without a ``Load weights`` span of their own (runai_streamer, sharded_state, tensorizer)
get ours, so that their totals and storage evidence have the same home.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks.load.shards import STATE, LoadState, ShardRead
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.semconv import PROCESS_WORKER as WORKER

_ML = "vllm.model_executor.model_loader"
_RUNAI = "runai_model_streamer.safetensors_streamer.safetensors_streamer"


def _wrap_load_file(load: LoadState, call, instance, args, kwargs):
    """safetensors ``load_file`` in a reader thread: the whole call is the read."""
    if load.running() is None:
        return call(*args, **kwargs)
    shard = load.shard(os.fspath(args[0] if args else kwargs["filename"]), "safetensors",
                       "threads")
    return _read_whole(shard, call, args, kwargs)


def _read_whole(shard: ShardRead, call: Any, args: tuple, kwargs: dict) -> Any:
    """A reader call that reads the whole file (returns its tensors): the call is the shard span,
    its wall time the read seconds."""
    shard.start()
    t0 = time.perf_counter()
    try:
        result = call(*args, **kwargs)
    finally:
        shard.read_s = time.perf_counter() - t0
        shard.finish()
    shard_tensors(shard, result)
    return result


def shard_tensors(shard: ShardRead, result: Any) -> None:
    with contextlib.suppress(TypeError):
        shard.tensors = len(result)


def _wrap_torch_load(load: LoadState, call, instance, args, kwargs):
    """``torch.load`` of a checkpoint file while a weights pass runs (either pt iterator)."""
    target = args[0] if args else kwargs.get("f")
    if load.running() is None or not isinstance(target, (str, os.PathLike)):
        return call(*args, **kwargs)
    return _read_whole(load.shard(os.fspath(target), "pt", "torch.load"), call, args, kwargs)


# --- Run:ai streamer -----------------------------------------------------------------------------

def _wrap_stream_files(load: LoadState, call, instance, args, kwargs):
    """Residency is taken before the streamer starts; the spans start with the request. The
    reads are kept in the load state under the streamer, until its tensors are delivered."""
    paths = list(args[0] if args else kwargs.get("paths", ()))
    # file index (the streamer's key) -> read; object-store URIs have no local file to measure
    reads = {i: load.shard(os.fspath(p), "safetensors", "runai_streamer")
             for i, p in enumerate(paths)
             if isinstance(p, (str, os.PathLike)) and "://" not in os.fspath(p)}
    start_ns = clock.now_ns()
    result = call(*args, **kwargs)
    for read in reads.values():
        read.start_ns = start_ns
        read.start()
    load.stream_started(instance, reads)
    return result


def _wrap_get_tensors(load: LoadState, call, instance, args, kwargs):
    reads = load.stream_reads(instance)
    inner = call(*args, **kwargs)
    if not reads:
        return inner
    try:
        owner, left = {}, {}
        for index, metas in instance.files_to_tensors_metadata.items():
            left[index] = len(metas)
            owner.update({m.name: index for m in metas})
    except Exception as exc:  # noqa: BLE001
        report_failure(GET_TENSORS, exc)
        return inner
    return delivered_by_file(inner, reads, owner, left,
                             lambda: load.stream_done(instance))


def delivered_by_file(inner, reads: dict[Any, ShardRead], owner: dict[str, Any],
                      left: dict[Any, int], done: Callable[[], None] | None = None):
    """A file's span ends when its last tensor arrives; read seconds are the span itself."""
    try:
        for name, tensor in inner:
            key = owner.get(name)
            read = reads.get(key)
            if read is not None:
                read.tensors += 1
                left[key] -= 1
                if left[key] == 0:
                    _end_stream(read)
            yield name, tensor
    finally:
        for read in reads.values():
            _end_stream(read)  # an interrupted load still closes its spans
        if done is not None:
            done()


def _end_stream(read: ShardRead) -> None:
    if read.span is None:
        return
    end_ns = clock.now_ns()
    read.read_s = (end_ns - read.start_ns) / 1e9
    read.finish(end_ns)


# --- fastsafetensors (GPU) ----------------------------------------------------------------------

def _wrap_fastsafetensors(load: LoadState, call, instance, args, kwargs):
    """Its ParallelLoader yields tensors without their file: the safetensors headers (read before
    the loader starts, a few KB each) say which file each name comes from."""
    files = [os.fspath(f) for f in (args[0] if args else kwargs["hf_weights_files"])]
    reads = {f: load.shard(f, "safetensors", "fastsafetensors") for f in files}
    owner, left = tensor_owners(files)
    start_ns = clock.now_ns()
    inner = call(*args, **kwargs)
    for read in reads.values():
        read.start_ns = start_ns
        read.start()
    return delivered_by_file(inner, reads, owner, left)


def tensor_owners(files: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """Tensor name -> file, and tensors per file, from the safetensors headers only."""
    from safetensors import safe_open

    owner, left = {}, {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
        left[path] = len(names)
        owner.update(dict.fromkeys(names, path))
    return owner, left


# --- loaders without a "Load weights" span ------------------------------------------------------

def _weights_pass(reader: str):
    def wrapper(load: LoadState, call, instance, args, kwargs):
        with load.stage_span(semconv.SPAN_LOAD_WEIGHTS, semconv.STAGE_LOAD,
                             enrich=semconv.SPAN_LOAD_WEIGHTS) as span:
            weights = load.begin(span, reader)
            try:
                return call(*args, **kwargs)
            finally:
                load.end(weights)

    return wrapper


def _wrap_sharded_files(load: LoadState, call, instance, args, kwargs):
    """vLLM's own iterator, one file per call: each file is read start to end inside it."""
    paths = list(args[0] if args else kwargs["paths"])
    if getattr(instance.load_config, "load_format", None) != "sharded_state":
        return call(*args, **kwargs)
    return _per_file(load, call, paths)


def _per_file(load: LoadState, call, paths: list[str]):
    for path in paths:
        read = load.shard(path, "safetensors", "sharded_state")
        read.start()
        inner = call([path])
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(inner)
                except StopIteration:
                    break
                finally:
                    read.read_s += time.perf_counter() - t0
                read.tensors += 1
                yield item
        finally:
            read.finish()


LOAD_FILE = Hook("load.shard_read_threads", f"{_ML}.weight_utils:load_file", _wrap_load_file,
                 stage=semconv.STAGE_LOAD_READ, process=WORKER, state=STATE)
TORCH_LOAD = Hook("load.shard_read_pt", "torch:load", _wrap_torch_load,
                  stage=semconv.STAGE_LOAD_READ, process=WORKER, state=STATE)
STREAM_FILES = Hook("load.runai_stream", f"{_RUNAI}:SafetensorsStreamer.stream_files",
                    _wrap_stream_files, stage=semconv.STAGE_LOAD_READ, process=WORKER,
                    optional=True, state=STATE)
GET_TENSORS = Hook("load.runai_tensors", f"{_RUNAI}:SafetensorsStreamer.get_tensors",
                   _wrap_get_tensors, stage=semconv.STAGE_LOAD_READ, process=WORKER,
                   optional=True, state=STATE)
RUNAI_WEIGHTS = Hook("load.runai_weights",
                     f"{_ML}.runai_streamer_loader:RunaiModelStreamerLoader.load_weights",
                     _weights_pass("runai_streamer"), stage=semconv.STAGE_LOAD,
                     process=WORKER, state=STATE)
SHARDED_WEIGHTS = Hook("load.sharded_state_weights",
                       f"{_ML}.sharded_state_loader:ShardedStateLoader.load_weights",
                       _weights_pass("sharded_state"), stage=semconv.STAGE_LOAD,
                       process=WORKER, state=STATE)
SHARDED_FILES = Hook("load.sharded_state_files",
                     f"{_ML}.sharded_state_loader:ShardedStateLoader.iterate_over_files",
                     _wrap_sharded_files, stage=semconv.STAGE_LOAD_READ, process=WORKER,
                     state=STATE)
FASTSAFETENSORS = Hook("load.fastsafetensors",
                       f"{_ML}.default_loader:fastsafetensors_weights_iterator",
                       _wrap_fastsafetensors, stage=semconv.STAGE_LOAD_READ, process=WORKER,
                       state=STATE)
TENSORIZER_WEIGHTS = Hook("load.tensorizer_weights",
                          f"{_ML}.tensorizer_loader:TensorizerLoader.load_weights",
                          _weights_pass("tensorizer"), stage=semconv.STAGE_LOAD,
                          process=WORKER, state=STATE)

HOOKS = [LOAD_FILE, TORCH_LOAD, STREAM_FILES, GET_TENSORS, RUNAI_WEIGHTS, SHARDED_WEIGHTS,
         SHARDED_FILES, FASTSAFETENSORS, TENSORIZER_WEIGHTS]


# --- what doctor reports per load format ---------------------------------------------------------
# (load format, reader, hooks that must resolve, module the format needs, why it is not hooked)
LOADERS: list[tuple[str, str, list[str], str | None, str | None]] = [
    ("auto / safetensors", "safe_open",
     ["load.shard_read", "load.shard_read_safetensors", "load.weights_total"], None, None),
    ("safetensors + enable_multithread_load", "threads",
     ["load.shard_read_threads", "load.weights_total"], None, None),
    ("pt / .bin (one thread or enable_multithread_load)", "torch.load",
     ["load.shard_read_pt", "load.weights_total"], None, None),
    ("runai_streamer", "runai_streamer",
     ["load.runai_stream", "load.runai_tensors", "load.runai_weights"], "runai_model_streamer",
     None),
    ("sharded_state", "sharded_state", ["load.sharded_state_weights", "load.sharded_state_files"],
     None, None),
    ("runai_streamer_sharded", "runai_streamer",
     ["load.sharded_state_weights", "load.runai_stream", "load.runai_tensors"],
     "runai_model_streamer", None),
    ("fastsafetensors (GPU; checked by scripts/gpu-check)", "fastsafetensors",
     ["load.fastsafetensors", "load.weights_total"], "fastsafetensors", None),
    ("instanttensor", "-", [], "instanttensor",
     "not hooked per file: one native reader over all files (CUDA only)"),
    ("tensorizer", "-", ["load.tensorizer_weights"], "tensorizer",
     "'Load weights' span only: one serialized stream, no per-shard reads to time"),
    ("npcache", "-", [], None, "not hooked per file: reads numpy caches with np.load"),
    ("gguf", "-", [], None, "vLLM 0.32 has no GGUF loader"),
]


def loader_report(resolved: dict[str, bool]) -> list[dict[str, Any]]:
    """Per load format: 'per-shard' when every hook it needs resolves and its reader package
    is importable, else the reason it is not hooked (doctor prints this)."""
    import importlib.util

    rows = []
    for fmt, reader, needed, package, reason in LOADERS:
        missing = [name for name in needed if not resolved.get(name, False)]
        if reason is None and missing:
            reason = f"hook target missing in this vLLM: {', '.join(missing)}"
        if reason is None and package and importlib.util.find_spec(package) is None:
            reason = f"package {package} is not installed"
        rows.append({"format": fmt, "reader": reader, "per_shard": reason is None,
                     "detail": reason or "per-shard spans"})
    return rows
