"""``load``: checkpoint shard reads, weight totals, post-processing, host-to-device copies.

A shard span opens at ``safe_open`` and closes with it; inside it we time only the reader
(``get_tensor``), so ``read seconds`` and GB/s are the storage side, while the consumer's time
(copying into parameters: host-to-device on a GPU) is reported separately as ``ttft.h2d.*``.
The other load formats' readers are in ``load_formats``; the rest of "Load model" in
``load_finish``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import wrapt
from opentelemetry import trace

from otel_ttft import semconv
from otel_ttft.runtime.hooks.load import shards as load_shards
from otel_ttft.runtime.hooks.load.shards import ShardRead, tensor_nbytes
from otel_ttft.runtime.hooks.registry import Hook, report_failure
from otel_ttft.runtime.telemetry import spans
from otel_ttft.semconv import PROCESS_WORKER as WORKER

_WEIGHT_UTILS = "vllm.model_executor.model_loader.weight_utils"
_DEFAULT_LOADER = "vllm.model_executor.model_loader.default_loader"
READER_SAFE_OPEN = "safe_open"


class _TracedShard(wrapt.ObjectProxy):
    """A ``safe_open`` handle that becomes a span once the first tensor is read from it."""

    def __init__(self, handle: Any, shard: ShardRead, hook: Hook):
        super().__init__(handle)
        self._self_shard = shard
        self._self_hook = hook
        self._self_started = False

    def __enter__(self):
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            return self.__wrapped__.__exit__(*exc)
        finally:
            self._self_finish()

    def get_tensor(self, name: str) -> Any:
        if self._self_hook.failed:
            return self.__wrapped__.get_tensor(name)
        if not self._self_started:
            self._self_started = True
            try:
                self._self_shard.start()
            except Exception as exc:  # noqa: BLE001
                report_failure(self._self_hook, exc)
                return self.__wrapped__.get_tensor(name)
        t0 = time.perf_counter()
        tensor = self.__wrapped__.get_tensor(name)
        self._self_shard.read_s += time.perf_counter() - t0
        self._self_shard.tensors += 1
        return tensor

    def _self_finish(self) -> None:
        try:
            self._self_shard.finish()  # metadata-only open: never started, no span
        except Exception as exc:  # noqa: BLE001
            report_failure(self._self_hook, exc)


def _wrap_safe_open(call, instance, args, kwargs):
    path = os.fspath(args[0] if args else kwargs.get("filename"))
    # residency is measured now, before safe_open reads the header
    shard = ShardRead(path, "safetensors", READER_SAFE_OPEN)
    return _TracedShard(call(*args, **kwargs), shard, SAFE_OPEN)


def _wrap_get_all_weights(call, instance, args, kwargs):
    """Totals go on vLLM's "Load weights" span; consumer time between yields is the copy side."""
    inner = call(*args, **kwargs)
    return _totals_generator(inner, trace.get_current_span(), _reader(instance))


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


def _totals_generator(inner, load_span, reader: str = READER_SAFE_OPEN):
    load = load_shards.begin(load_span, reader)
    try:
        while True:
            try:
                item = next(inner)
            except StopIteration:
                return
            resumed = time.perf_counter()
            load.tensor_bytes += tensor_nbytes(item[1])
            yield item
            load.consumer_s += time.perf_counter() - resumed
    finally:
        try:
            load_shards.end(load)
        except Exception as exc:  # noqa: BLE001
            report_failure(GET_ALL_WEIGHTS, exc)


def _wrap_process_weights(call, instance, args, kwargs):
    with spans.stage_span(semconv.SPAN_PROCESS_WEIGHTS, semconv.STAGE_LOAD_PROCESS) as span:
        result = call(*args, **kwargs)
        model = args[0] if args else kwargs.get("model")
        span.set_attribute(semconv.ATTR_LOAD_MODEL_BYTES, _parameter_bytes(model))
        return result


def _parameter_bytes(model: Any) -> int:
    """What the model holds on its device once loading and post-processing are done."""
    return sum(tensor_nbytes(p) for p in model.parameters())


SAFE_OPEN = Hook("load.shard_read", f"{_WEIGHT_UTILS}:safe_open", _wrap_safe_open,
                 stage=semconv.STAGE_LOAD_READ, process=WORKER)
GET_ALL_WEIGHTS = Hook("load.weights_total",
                       f"{_DEFAULT_LOADER}:DefaultModelLoader.get_all_weights",
                       _wrap_get_all_weights, stage=semconv.STAGE_LOAD, process=WORKER)
PROCESS_WEIGHTS = Hook("load.process_weights",
                       "vllm.model_executor.model_loader.base_loader:process_weights_after_loading",
                       _wrap_process_weights, stage=semconv.STAGE_LOAD_PROCESS, process=WORKER)

HOOKS = [SAFE_OPEN, GET_ALL_WEIGHTS, PROCESS_WEIGHTS]
