"""``load``: checkpoint shard reads, weight totals, post-processing, host-to-device copies.

A shard span opens at ``safe_open`` and closes with it; inside it we time only the reader
(``get_tensor``), so ``read seconds`` and GB/s are the storage side, while the consumer's time
(copying into parameters: host-to-device on a GPU) is reported separately as ``ttft.h2d.*``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import wrapt
from opentelemetry import trace

from otel_ttft import clock, metrics, pagecache, semconv, spans
from otel_ttft.hooks.registry import Hook, report_failure

_WEIGHT_UTILS = "vllm.model_executor.model_loader.weight_utils"
_DEFAULT_LOADER = "vllm.model_executor.model_loader.default_loader"


class _LoadTotals:
    """What the shards of one ``get_all_weights`` pass add up to."""

    def __init__(self) -> None:
        self.opened = 0  # shards whose first tensor was read: the next shard's index
        self.shards = 0
        self.bytes = 0
        self.read_s = 0.0
        self.consumer_s = 0.0
        self.tensor_bytes = 0


_totals: _LoadTotals | None = None  # set while a get_all_weights pass is running


def _tensor_nbytes(tensor: Any) -> int:
    try:
        return int(tensor.numel() * tensor.element_size())
    except Exception:  # noqa: BLE001 - odd tensor subclasses
        return 0


class _TracedShard(wrapt.ObjectProxy):
    """A ``safe_open`` handle that becomes a span once the first tensor is read from it."""

    def __init__(self, handle: Any, path: str, hook: Hook, resident: float | None):
        super().__init__(handle)
        self._self_resident = resident
        self._self_path = path
        self._self_hook = hook
        self._self_span = None
        self._self_read_s = 0.0
        self._self_tensors = 0
        self._self_open_ns = clock.now_ns()
        self._self_parent = trace.set_span_in_context(trace.get_current_span())

    def __enter__(self):
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            return self.__wrapped__.__exit__(*exc)
        finally:
            self._self_finish()

    def _self_start(self) -> None:
        path = self._self_path
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        self._self_span = spans.tracer().start_span(
            semconv.SPAN_SHARD_READ, context=self._self_parent, start_time=self._self_open_ns)
        spans.tag_span(self._self_span, semconv.STAGE_LOAD_READ, {
            semconv.ATTR_SHARD_PATH: path,
            semconv.ATTR_SHARD_INDEX: _totals.opened if _totals is not None else None,
            semconv.ATTR_SHARD_BYTES: size,
            semconv.ATTR_LOAD_FORMAT: "safetensors",
            semconv.ATTR_FS_TYPE: pagecache.filesystem_type(path),
            semconv.ATTR_PAGE_CACHE_RESIDENT: self._self_resident,
        })
        self._self_bytes = size
        if _totals is not None:
            _totals.opened += 1

    def get_tensor(self, name: str) -> Any:
        if self._self_hook.failed:
            return self.__wrapped__.get_tensor(name)
        if self._self_span is None:
            try:
                self._self_start()
            except Exception as exc:  # noqa: BLE001
                report_failure(self._self_hook, exc)
                return self.__wrapped__.get_tensor(name)
        t0 = time.perf_counter()
        tensor = self.__wrapped__.get_tensor(name)
        self._self_read_s += time.perf_counter() - t0
        self._self_tensors += 1
        return tensor

    def _self_finish(self) -> None:
        span = self._self_span
        if span is None:
            return  # metadata-only open: no read, no span
        self._self_span = None
        try:
            read_s = self._self_read_s
            gbps = self._self_bytes / read_s / 1e9 if read_s > 0 else None
            span.set_attributes({
                semconv.ATTR_READ_SECONDS: read_s,
                semconv.ATTR_SHARD_TENSORS: self._self_tensors,
            })
            if gbps is not None:
                span.set_attribute(semconv.ATTR_READ_GB_PER_S, gbps)
            span.end(end_time=clock.now_ns())
            if _totals is not None:
                _totals.shards += 1
                _totals.bytes += self._self_bytes
                _totals.read_s += read_s
            metrics.record_shard_read(self._self_bytes, gbps, spans.served_model)
        except Exception as exc:  # noqa: BLE001
            report_failure(self._self_hook, exc)


def _wrap_safe_open(call, instance, args, kwargs):
    path = os.fspath(args[0] if args else kwargs.get("filename"))
    resident = pagecache.resident_ratio(path)  # before safe_open reads the header
    return _TracedShard(call(*args, **kwargs), path, SAFE_OPEN, resident)


def _wrap_get_all_weights(call, instance, args, kwargs):
    """Totals go on vLLM's "Load weights" span; consumer time between yields is the copy side."""
    inner = call(*args, **kwargs)
    return _totals_generator(inner, trace.get_current_span())


def _totals_generator(inner, load_span):
    global _totals
    totals = _totals = _LoadTotals()
    start = time.perf_counter()
    try:
        while True:
            try:
                item = next(inner)
            except StopIteration:
                return
            resumed = time.perf_counter()
            totals.tensor_bytes += _tensor_nbytes(item[1])
            yield item
            totals.consumer_s += time.perf_counter() - resumed
    finally:
        _totals = None
        wall = time.perf_counter() - start
        try:
            _finish_totals(totals, wall, load_span)
        except Exception as exc:  # noqa: BLE001
            report_failure(GET_ALL_WEIGHTS, exc)


def _finish_totals(totals: _LoadTotals, wall_s: float, load_span) -> None:
    if not load_span.is_recording():
        return
    attrs: dict[str, Any] = {
        semconv.ATTR_LOAD_SHARDS: totals.shards,
        semconv.ATTR_LOAD_BYTES: totals.bytes,
        semconv.ATTR_READ_SECONDS: totals.read_s,
    }
    if wall_s > 0 and totals.bytes:
        attrs[semconv.ATTR_LOAD_GB_PER_S] = totals.bytes / wall_s / 1e9
    if _device_is_accelerator() and totals.consumer_s > 0:
        attrs[semconv.ATTR_H2D_BYTES] = totals.tensor_bytes
        attrs[semconv.ATTR_H2D_GB_PER_S] = totals.tensor_bytes / totals.consumer_s / 1e9
    load_span.set_attributes(attrs)


def _device_is_accelerator() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda_alike() or current_platform.is_xpu())
    except Exception:  # noqa: BLE001
        return False


def _wrap_process_weights(call, instance, args, kwargs):
    with spans.stage_span(semconv.SPAN_PROCESS_WEIGHTS, semconv.STAGE_LOAD_PROCESS) as span:
        result = call(*args, **kwargs)
        model = args[0] if args else kwargs.get("model")
        span.set_attribute(semconv.ATTR_LOAD_MODEL_BYTES, _parameter_bytes(model))
        return result


def _parameter_bytes(model: Any) -> int:
    """What the model holds on its device once loading and post-processing are done."""
    return sum(_tensor_nbytes(p) for p in model.parameters())


SAFE_OPEN = Hook("load.shard_read", f"{_WEIGHT_UTILS}:safe_open", _wrap_safe_open,
                 stage=semconv.STAGE_LOAD_READ, process="worker")
GET_ALL_WEIGHTS = Hook("load.weights_total",
                       f"{_DEFAULT_LOADER}:DefaultModelLoader.get_all_weights",
                       _wrap_get_all_weights, stage=semconv.STAGE_LOAD, process="worker")
PROCESS_WEIGHTS = Hook("load.process_weights",
                       "vllm.model_executor.model_loader.base_loader:process_weights_after_loading",
                       _wrap_process_weights, stage=semconv.STAGE_LOAD_PROCESS, process="worker")

HOOKS = [SAFE_OPEN, GET_ALL_WEIGHTS, PROCESS_WEIGHTS]
