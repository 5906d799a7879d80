"""Shard read spans, and the totals a weights pass adds up to, shared by every load format.

A *pass* is one ``Load weights``: it remembers each shard read (bytes, read seconds, interval,
residency before the read) so that ``Load weights`` can carry the totals, the union wall time of
reads that overlap (reader threads, the Run:ai streamer) with the aggregate GB/s it implies, and
the storage evidence. Reader threads have no span context of their own: their shard spans take the
pass's span as parent.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.context import process as this_process
from otel_ttft.runtime.hooks.load import pagecache, storage
from otel_ttft.runtime.telemetry import metrics, spans

_UNSET = object()


class LoadPass:
    """One weights pass: what its shards read, for the totals on ``Load weights``."""

    def __init__(self, span: Any, reader: str):
        self.span = span
        self.reader = reader
        self.context = trace.set_span_in_context(span)
        self.lock = threading.Lock()
        self.opened = 0  # shards started: the next shard's index
        self.paths: list[str] = []
        self.readers: set[str] = set()
        self.intervals: list[tuple[int, int]] = []
        self.bytes = 0
        self.read_s = 0.0
        self.resident_weighted = 0.0
        self.resident_bytes = 0
        self.consumer_s = 0.0  # time the consumer held each tensor (copy side)
        self.tensor_bytes = 0
        self.started = time.perf_counter()

    def next_index(self) -> int:
        with self.lock:
            index = self.opened
            self.opened += 1
            return index

    def add(self, shard: ShardRead, end_ns: int) -> None:
        with self.lock:
            self.paths.append(shard.path)
            self.readers.add(shard.reader)
            self.intervals.append((shard.start_ns, end_ns))
            self.bytes += shard.size
            self.read_s += shard.read_s
            if shard.resident is not None:
                self.resident_weighted += shard.resident * max(shard.size, 1)
                self.resident_bytes += max(shard.size, 1)


_current: LoadPass | None = None  # the pass running now (process-wide: reader threads see it)


def current() -> LoadPass | None:
    return _current


def begin(span: Any, reader: str) -> LoadPass:
    global _current
    _current = LoadPass(span, reader)
    return _current


def end(load: LoadPass) -> None:
    """Close the pass and put its totals on its span."""
    global _current
    if _current is load:
        _current = None
    if load.span.is_recording():
        load.span.set_attributes(totals(load, time.perf_counter() - load.started))


def checkpoint_bytes(paths: list[str]) -> int:
    """Bytes on disk of the checkpoint the read shards belong to: every file of their kind in
    their folders, read or not (a filter that skipped shards shows as bytes read < this)."""
    total, seen = 0, set()
    for path in paths:
        folder, suffix = os.path.dirname(path), os.path.splitext(path)[1]
        if (folder, suffix) in seen:
            continue
        seen.add((folder, suffix))
        try:
            for entry in os.scandir(folder or "."):
                if entry.is_file() and entry.name.endswith(suffix):
                    total += entry.stat().st_size
        except OSError:
            continue
    return total


def totals(load: LoadPass, wall_s: float) -> dict[str, Any]:
    union_s = clock.union_ns(load.intervals) / 1e9
    attrs: dict[str, Any] = {
        # what actually read the shards (a .bin checkpoint under the default loader: torch.load)
        semconv.ATTR_LOAD_READER: ",".join(sorted(load.readers)) or load.reader,
        semconv.ATTR_LOAD_SHARDS: len(load.paths),
        semconv.ATTR_LOAD_BYTES: load.bytes,
        semconv.ATTR_READ_SECONDS: load.read_s,
        semconv.ATTR_LOAD_READ_UNION_SECONDS: union_s,
    }
    if wall_s > 0 and load.bytes:
        attrs[semconv.ATTR_LOAD_GB_PER_S] = load.bytes / wall_s / 1e9
    if union_s > 0 and load.bytes:
        attrs[semconv.ATTR_LOAD_READ_AGGREGATE_GB_PER_S] = load.bytes / union_s / 1e9
    if load.resident_bytes:
        attrs[semconv.ATTR_PAGE_CACHE_RESIDENT] = load.resident_weighted / load.resident_bytes
    if load.paths:
        attrs[semconv.ATTR_CHECKPOINT_BYTES] = checkpoint_bytes(load.paths)
        found = storage.evidence(load.paths)
        attrs.update({k: v for k, v in {
            semconv.ATTR_FS_TYPE: found.get("fs_type"),
            semconv.ATTR_FS_REMOTE: found.get("remote"),
            semconv.ATTR_BLOCK_DEVICE: found.get("device"),
            semconv.ATTR_BLOCK_ROTATIONAL: found.get("rotational"),
        }.items() if v is not None})
    if device_is_accelerator() and load.consumer_s > 0:
        attrs[semconv.ATTR_H2D_BYTES] = load.tensor_bytes
        attrs[semconv.ATTR_H2D_GB_PER_S] = load.tensor_bytes / load.consumer_s / 1e9
    return attrs


def device_is_accelerator() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda_alike() or current_platform.is_xpu())
    except Exception:  # noqa: BLE001
        return False


class ShardRead:
    """One file (or chunked file) read: a ``Read checkpoint shard`` span with today's attributes.

    ``resident`` is measured at construction unless given: construct it before the reader touches
    the file. ``read_s`` is the reader's time; for overlapping readers it is the span itself.
    """

    def __init__(self, path: str, file_format: str, reader: str, *, resident: Any = _UNSET,
                 start_ns: int | None = None):
        self.path = path
        self.file_format = file_format
        self.reader = reader
        self.resident = pagecache.resident_ratio(path) if resident is _UNSET else resident
        self.start_ns = start_ns if start_ns is not None else clock.now_ns()
        self.load = _current
        self.parent = (self.load.context if self.load is not None
                       else trace.set_span_in_context(trace.get_current_span()))
        self.span = None
        self.size = 0
        self.read_s = 0.0
        self.tensors = 0

    def start(self) -> None:
        try:
            self.size = os.path.getsize(self.path)
        except OSError:
            self.size = 0
        self.span = spans.tracer().start_span(semconv.SPAN_SHARD_READ, context=self.parent,
                                              start_time=self.start_ns)
        spans.tag_span(self.span, semconv.STAGE_LOAD_READ, {
            semconv.ATTR_SHARD_PATH: self.path,
            semconv.ATTR_SHARD_INDEX: self.load.next_index() if self.load is not None else None,
            semconv.ATTR_SHARD_BYTES: self.size,
            semconv.ATTR_LOAD_FORMAT: self.file_format,
            semconv.ATTR_LOAD_READER: self.reader,
            semconv.ATTR_FS_TYPE: pagecache.filesystem_type(self.path),
            semconv.ATTR_PAGE_CACHE_RESIDENT: self.resident,
        })

    def finish(self, end_ns: int | None = None) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        end_ns = end_ns if end_ns is not None else clock.now_ns()
        gbps = self.size / self.read_s / 1e9 if self.read_s > 0 else None
        span.set_attributes({semconv.ATTR_READ_SECONDS: self.read_s,
                             semconv.ATTR_SHARD_TENSORS: self.tensors})
        if gbps is not None:
            span.set_attribute(semconv.ATTR_READ_GB_PER_S, gbps)
        span.end(end_time=end_ns)
        if self.load is not None:
            self.load.add(self, end_ns)
        metrics.record_shard_read(self.size, gbps, this_process.served_model)


def tensor_nbytes(tensor: Any) -> int:
    try:
        return int(tensor.numel() * tensor.element_size())
    except Exception:  # noqa: BLE001 - odd tensor subclasses
        return 0
