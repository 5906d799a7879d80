"""``load``: checkpoint shard reads, weight totals, post-processing, host-to-device copies.

vLLM's safetensors reader (``safetensors_weights_iterator``) opens one file at a time with
``safe_open`` and reads its tensors. Two hooks make its shard spans, touching nothing of vLLM's or
safetensors' objects: the one on the iterator times each step of vLLM's generator (the reader's
time) and hands each tensor on; the one on ``safe_open`` notes, for the iterator running in its
thread, which file is open from now on (page-cache residency measured just before). A file's span
runs from its ``safe_open`` to the opening of the next file (or the end of the iterator) and is
made once a tensor comes from it (a file all of whose tensors are skipped has none); its read
seconds are the time spent inside vLLM's reader while it was open (header, ``get_tensor``, and
the storage reads of each tensor's memory-mapped pages, faulted in before the tensor is handed
on: ``pagecache.fault_in``), so ``read seconds`` and GB/s are the storage side, while the
consumer's time (copying into parameters: host-to-device on a GPU) is reported separately as
``ttft.load.copy.seconds`` and ``ttft.h2d.*`` by the totals on
``Load weights``. The other load formats' readers are in ``formats``; the rest of "Load model"
in ``finish``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks.load import pagecache
from otel_ttft.runtime.hooks.load.shards import STATE, LoadState, ShardRead, tensor_nbytes
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.semconv import PROCESS_WORKER as WORKER

_WEIGHT_UTILS = "vllm.model_executor.model_loader.weight_utils"
_DEFAULT_LOADER = "vllm.model_executor.model_loader.default_loader"
READER_SAFE_OPEN = "safe_open"


class _OpenFiles:
    """One call of vLLM's safetensors iterator: the file open now and the files ``safe_open``
    opened during the current step (when it was entered, on the one clock and on
    ``perf_counter``, and the read it may become)."""

    def __init__(self) -> None:
        self.current: ShardRead | None = None
        self.opened: list[tuple[int, float, ShardRead, float]] = []

    def open(self, entered_ns: int, entered: float, read: ShardRead) -> None:
        self.opened.append((entered_ns, entered, read, time.perf_counter()))

    def step(self, t0: float, t1: float, delivered: bool, faulted: int = 0) -> None:
        """One step of vLLM's generator ran from ``t0`` to ``t1`` and yielded a tensor or not
        (``faulted``: its bytes read from storage as we faulted them in, within the step)."""
        opened, self.opened = self.opened, []
        if opened:
            closed_ns, closed_at = opened[0][0], opened[0][1]
            if self.current is not None:  # the file before ended when the next one was opened
                self.current.read_s += closed_at - t0
                self.current.finish(closed_ns)
            for (_, _, between, _), (next_ns, _, _, _) in zip(opened, opened[1:], strict=False):
                between.finish(next_ns)  # opened and left in one step: nothing read from it
            _, _, self.current, opened_at = opened[-1]
            self.current.read_s += t1 - opened_at
        elif self.current is not None:
            self.current.read_s += t1 - t0
        if delivered and self.current is not None:
            self.current.tensors += 1
            self.current.faulted_bytes += faulted

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.finish()


def _wrap_safe_open(load: LoadState, call, instance, args, kwargs):
    """A file opened by vLLM's safetensors iterator (in this thread): it is the one read now.
    Other ``safe_open`` calls (metadata reads) pass through untouched."""
    files = load.reading()
    if isinstance(files, _OpenFiles):
        entered_ns, entered = clock.now_ns(), time.perf_counter()
        path = os.fspath(args[0] if args else kwargs["filename"])
        # residency is measured now, before safe_open reads the header
        read = load.shard(path, "safetensors", READER_SAFE_OPEN)
        files.open(entered_ns, entered, read)
        read.start()  # open from here: a read that never returns is live as load.read
    return call(*args, **kwargs)


def _wrap_safetensors_iterator(load: LoadState, call, instance, args, kwargs):
    return _shards_by_open_file(load, call(*args, **kwargs))


def _noting(hook: Hook, note: Callable[..., None], *args: Any) -> None:
    """Our bookkeeping inside a generator handed to vLLM: a failure of ours is the hook's (once)
    and never reaches vLLM."""
    if hook.failed:
        return
    try:
        note(*args)
    except Exception as exc:  # noqa: BLE001
        report_failure(hook, exc)


def _faulted_in(load: LoadState, item: Any) -> int:
    """The storage reads of the tensor about to be handed over, done now (the step's time, the
    read stage) rather than as page faults in the consumer's copy (see ``pagecache.fault_in``)."""
    if SAFETENSORS_READS.failed:
        return 0
    try:
        libc = load.libc()
        return pagecache.fault_in(item[1], libc) if libc is not None else 0
    except Exception as exc:  # noqa: BLE001
        report_failure(SAFETENSORS_READS, exc)
        return 0


def _shards_by_open_file(load: LoadState, inner: Iterator[Any]) -> Iterator[Any]:
    """vLLM's generator, item for item, each step timed and charged to the file open in it."""
    files = _OpenFiles()
    try:
        while True:
            previous = load.enter_reading(files)
            t0 = time.perf_counter()
            try:
                item = next(inner)
            except StopIteration:
                _noting(SAFETENSORS_READS, files.step, t0, time.perf_counter(), False)
                return
            finally:
                load.leave_reading(previous)
            faulted = _faulted_in(load, item)
            _noting(SAFETENSORS_READS, files.step, t0, time.perf_counter(), True, faulted)
            yield item
    finally:
        try:
            files.close()  # even after a failure of ours: no span is left open
        except Exception as exc:  # noqa: BLE001
            report_failure(SAFETENSORS_READS, exc)
        close = getattr(inner, "close", None)
        if close is not None:
            close()


def _wrap_get_all_weights(load: LoadState, call, instance, args, kwargs):
    """Totals go on vLLM's "Load weights" span; consumer time between yields is the copy side."""
    inner = call(*args, **kwargs)
    return _totals_generator(load, inner, trace.get_current_span(), _reader(instance))


def _reader(loader: Any) -> str:
    """Which reader the default loader picks for its config (as vLLM's _get_weights_iterator)."""
    try:
        config = loader.load_config
        fmt = str(getattr(config.load_format, "value", config.load_format))
        if fmt in ("fastsafetensors", "instanttensor", "npcache"):
            return fmt
        if (config.model_loader_extra_config or {}).get("enable_multithread_load"):
            return "threads"
    except Exception:  # noqa: BLE001
        pass
    return READER_SAFE_OPEN


def _totals_generator(state: LoadState, inner: Iterator[Any], load_span: Any,
                      reader: str = READER_SAFE_OPEN) -> Iterator[Any]:
    load = state.begin(load_span, reader)
    try:
        while True:
            try:
                item = next(inner)
            except StopIteration:
                return
            resumed = time.perf_counter()
            load.delivered(tensor_nbytes(item[1]))
            yield item
            load.consumed(time.perf_counter() - resumed)
    finally:
        try:
            state.end(load)
        except Exception as exc:  # noqa: BLE001
            report_failure(GET_ALL_WEIGHTS, exc)
        close = getattr(inner, "close", None)
        if close is not None:
            close()


def _wrap_process_weights(load: LoadState, call, instance, args, kwargs):
    with load.stage_span(semconv.SPAN_PROCESS_WEIGHTS, semconv.STAGE_LOAD_PROCESS) as span:
        result = call(*args, **kwargs)
        model = args[0] if args else kwargs.get("model")
        span.set_attribute(semconv.ATTR_LOAD_MODEL_BYTES, _parameter_bytes(model))
        return result


def _parameter_bytes(model: Any) -> int:
    """What the model holds on its device once loading and post-processing are done."""
    return sum(tensor_nbytes(p) for p in model.parameters())


SAFE_OPEN = Hook("load.shard_read", f"{_WEIGHT_UTILS}:safe_open", _wrap_safe_open,
                 stage=semconv.STAGE_LOAD_READ, process=WORKER, state=STATE)
# The default loader's own name for it (its only caller): the one it calls even where vLLM imported
# the loader before instrumenting (the plugin path loads in a worker after its imports).
SAFETENSORS_READS = Hook("load.shard_read_safetensors",
                         f"{_DEFAULT_LOADER}:safetensors_weights_iterator",
                         _wrap_safetensors_iterator, stage=semconv.STAGE_LOAD_READ,
                         process=WORKER, state=STATE)
GET_ALL_WEIGHTS = Hook("load.weights_total",
                       f"{_DEFAULT_LOADER}:DefaultModelLoader.get_all_weights",
                       _wrap_get_all_weights, stage=semconv.STAGE_LOAD, process=WORKER,
                       state=STATE)
PROCESS_WEIGHTS = Hook("load.process_weights",
                       "vllm.model_executor.model_loader.base_loader:process_weights_after_loading",
                       _wrap_process_weights, stage=semconv.STAGE_LOAD_PROCESS, process=WORKER,
                       state=STATE)

HOOKS = [SAFE_OPEN, SAFETENSORS_READS, GET_ALL_WEIGHTS, PROCESS_WEIGHTS]
