"""The load family's state (:class:`LoadState`), and what every load format shares: shard read
spans and the totals of a weights pass.

A *pass* is one ``Load weights``: it remembers each shard read (bytes, read seconds, interval,
residency before the read) so that ``Load weights`` can carry the totals, the union wall time of
reads that overlap (reader threads, the Run:ai streamer) with the aggregate GB/s it implies, and
the storage evidence. Reader threads have no span context of their own: their shard spans take the
pass's span as parent.

:class:`LoadState` is the family's part of the process state (``runtime.state``), handed to every
load hook (``Hook.state``): the pass running now (process-wide: reader threads see it), the shard
spans started and not yet ended, the safetensors reader each thread runs (``weights``), the Run:ai
streamers' reads in flight (``formats``), libc for the residency probe, and the tracer. Only this
module reads or writes its fields; the hooks call its methods. Closing it ends what is still open.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks.load import pagecache, storage
from otel_ttft.runtime.state import PartSpec
from otel_ttft.runtime.telemetry import metrics, spans

STATE = "load"
"""The load family's part (``Hook.state`` of every load hook)."""

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
        self.ended = False

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

    def delivered(self, nbytes: int) -> None:
        """A tensor handed to the consumer (the copy side's bytes)."""
        self.tensor_bytes += nbytes

    def consumed(self, seconds: float) -> None:
        """The consumer held a tensor this long before asking for the next."""
        self.consumer_s += seconds

    def finish(self) -> None:
        """Put the totals on the pass's span, once (the span is vLLM's or ours: its owner ends
        it)."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
        if self.span.is_recording():
            self.span.set_attributes(totals(self, time.perf_counter() - self.started))


class LoadState:
    """What the load family keeps in one process (see the module's docstring)."""

    def __init__(self, process_state: Any):
        self._tracer = process_state.tracer
        self._identity = process_state.identity
        self._metrics = process_state.part(metrics.PART)  # the stage metrics, made before
        self._lock = threading.Lock()
        self._running: LoadPass | None = None
        self._open: set[ShardRead] = set()  # shard spans started, not yet ended
        self._threads = threading.local()  # .reading: the safetensors reader this thread runs
        self._streams: weakref.WeakKeyDictionary[Any, dict[Any, ShardRead]] = \
            weakref.WeakKeyDictionary()  # Run:ai streamer -> its files' reads
        self._libc: Any = None  # pagecache.open_libc(), once; False where it cannot be found
        self._closed = False

    # --- the pass ---------------------------------------------------------------------------

    def begin(self, span: Any, reader: str) -> LoadPass:
        """A weights pass starts under ``span``; it is the running one until it ends."""
        load = LoadPass(span, reader)
        with self._lock:
            self._running = load
        return load

    def end(self, load: LoadPass) -> None:
        """Close the pass and put its totals on its span."""
        with self._lock:
            if self._running is load:
                self._running = None
        load.finish()

    def running(self) -> LoadPass | None:
        """The pass running now, if any (from any thread)."""
        return self._running

    # --- shard reads ------------------------------------------------------------------------

    def shard(self, path: str, file_format: str, reader: str, *, resident: Any = _UNSET,
              start_ns: int | None = None) -> ShardRead:
        """A read of ``path`` in the running pass; residency is measured now unless given:
        call this before the reader touches the file."""
        if resident is _UNSET:
            resident = self._resident(path)
        return ShardRead(self, path, file_format, reader, resident=resident, start_ns=start_ns)

    def _resident(self, path: str) -> float | None:
        if self._libc is None:
            try:
                self._libc = pagecache.open_libc()
            except OSError:
                self._libc = False
        if self._libc is False:
            return None
        return pagecache.resident_ratio(path, libc=self._libc)

    def _started(self, read: ShardRead) -> None:
        with self._lock:
            self._open.add(read)

    def _ended(self, read: ShardRead) -> None:
        with self._lock:
            self._open.discard(read)

    def stage_span(self, name: str, stage: str | None, **kwargs: Any
                   ) -> AbstractContextManager[Any]:
        """``spans.stage_span`` with this process's tracer and identity."""
        return spans.stage_span(name, stage, tracer=self._tracer, identity=self._identity,
                                **kwargs)

    # --- the safetensors reader each thread runs (``weights``) -------------------------------

    def reading(self) -> Any:
        """What this thread's safetensors iterator noted as running now (None outside one)."""
        return getattr(self._threads, "reading", None)

    def enter_reading(self, reading: Any) -> Any:
        """``reading`` runs in this thread until :meth:`leave_reading` (given what this
        returns: the one it interrupted)."""
        previous = getattr(self._threads, "reading", None)
        if not self._closed:  # a reader still running after uninstrument notes nothing more
            self._threads.reading = reading
        return previous

    def leave_reading(self, previous: Any) -> None:
        self._threads.reading = previous

    # --- the Run:ai streamer's reads (``formats``) -------------------------------------------

    def stream_started(self, streamer: Any, reads: dict[Any, ShardRead]) -> None:
        """``streamer`` reads these files (its file index -> read) from now on."""
        with self._lock:
            self._streams[streamer] = reads

    def stream_reads(self, streamer: Any) -> dict[Any, ShardRead] | None:
        with self._lock:
            return self._streams.get(streamer)

    def stream_done(self, streamer: Any) -> None:
        with self._lock:
            self._streams.pop(streamer, None)

    # --- uninstrument -----------------------------------------------------------------------

    def close(self) -> None:
        """End every shard span still open and the running pass; drop every reference."""
        with self._lock:
            self._closed = True
            reads, self._open = list(self._open), set()
            running, self._running = self._running, None
            self._streams = weakref.WeakKeyDictionary()
            self._threads = threading.local()
            self._libc = None
        for read in reads:
            read.finish()
        if running is not None:
            running.finish()

    def open_shards(self) -> list[ShardRead]:
        """The shard spans started and not ended yet."""
        with self._lock:
            return list(self._open)


PART = PartSpec(STATE, LoadState)
"""How the process state makes the load family's part (``hooks.all_parts``)."""


class ShardRead:
    """One file (or chunked file) read: a ``Read checkpoint shard`` span with today's attributes.

    Made by :meth:`LoadState.shard` before the reader touches the file (residency is measured
    then). ``read_s`` is the reader's time; for overlapping readers it is the span itself.
    """

    def __init__(self, state: LoadState, path: str, file_format: str, reader: str, *,
                 resident: float | None, start_ns: int | None = None):
        self.state = state
        self.path = path
        self.file_format = file_format
        self.reader = reader
        self.resident = resident
        self.start_ns = start_ns if start_ns is not None else clock.now_ns()
        self.load = state._running
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
        self.span = self.state._tracer.start_span(
            semconv.SPAN_SHARD_READ, context=self.parent, start_time=self.start_ns,
            attributes={semconv.ATTR_STAGE: semconv.STAGE_LOAD_READ})
        self.state._started(self)
        spans.tag_span(self.span, semconv.STAGE_LOAD_READ, {
            semconv.ATTR_SHARD_PATH: self.path,
            semconv.ATTR_SHARD_INDEX: self.load.next_index() if self.load is not None else None,
            semconv.ATTR_SHARD_BYTES: self.size,
            semconv.ATTR_LOAD_FORMAT: self.file_format,
            semconv.ATTR_LOAD_READER: self.reader,
            semconv.ATTR_FS_TYPE: pagecache.filesystem_type(self.path),
            semconv.ATTR_PAGE_CACHE_RESIDENT: self.resident,
        }, self.state._identity)

    def finish(self, end_ns: int | None = None) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        self.state._ended(self)
        end_ns = end_ns if end_ns is not None else clock.now_ns()
        gbps = self.size / self.read_s / 1e9 if self.read_s > 0 else None
        span.set_attributes({semconv.ATTR_READ_SECONDS: self.read_s,
                             semconv.ATTR_SHARD_TENSORS: self.tensors})
        if gbps is not None:
            span.set_attribute(semconv.ATTR_READ_GB_PER_S, gbps)
        span.end(end_time=end_ns)
        if self.load is not None:
            self.load.add(self, end_ns)
        self.state._metrics.record_shard_read(self.size, gbps, self.state._identity.served_model)


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


def tensor_nbytes(tensor: Any) -> int:
    try:
        return int(tensor.numel() * tensor.element_size())
    except Exception:  # noqa: BLE001 - odd tensor subclasses
        return 0
