"""What an "Allocate KV cache" allocated, read from the ``KVCacheConfig`` vLLM allocates it from.

Since vLLM 0.32 a model's KV cache is one backing allocation per pool (the device pool, and
HiSparse's host pool) that every KV-cache group views: each ``KVCacheTensor.size`` is the size of
that shared buffer, so a hybrid model (sliding window plus full attention: two groups) lists it
twice. Bytes are therefore counted once per backing allocation; a ``KVCacheTensor`` without
placement fields (``layer_stride``: vLLM before the shared layout) is an allocation of its own.

Token capacity is vLLM's group-aware one, the figure it logs as "KV cache size: N tokens": the
groups draw their blocks from one pool and a request of ``max_model_len`` tokens takes
``cdiv(spec.max_memory_usage_bytes(vllm_config), spec.page_size_bytes)`` blocks in each group
(vLLM's ``get_max_concurrency_for_kv_cache_config``), so the pool holds ``num_blocks / sum``
such requests. A sliding-window group holds its window, not the whole sequence.
"""

from __future__ import annotations

from typing import Any

from otel_ttft import semconv


def _spec_name(spec: Any) -> str:
    return type(spec).__name__


def _first_layer_spec(spec: Any) -> Any:
    """A ``UniformTypeKVCacheSpecs`` (the worker's aggregate) stands for layers of one type."""
    specs = getattr(spec, "kv_cache_specs", None)
    if isinstance(specs, dict) and specs:
        return next(iter(specs.values()))
    return spec


def allocated_bytes(tensors: list[Any]) -> tuple[int, int]:
    """(device bytes, host bytes) allocated for ``tensors``: a shared backing buffer once per pool,
    a tensor of the older layout (no ``layer_stride``) as its own allocation."""
    device = host = 0
    shared: dict[bool, int] = {}
    for tensor in tensors:
        size = int(tensor.size)
        on_host = bool(getattr(tensor, "host_resident", False))
        if hasattr(tensor, "layer_stride"):  # placed in the pool's one allocation
            shared[on_host] = max(shared.get(on_host, 0), size)
        elif on_host:
            host += size
        else:
            device += size
    return device + shared.get(False, 0), host + shared.get(True, 0)


def _blocks_per_request(spec: Any, vllm_config: Any) -> int | None:
    """Blocks one ``max_model_len`` request takes in this group, as vLLM counts them."""
    if vllm_config is None:
        return None
    usage, page = spec.max_memory_usage_bytes(vllm_config), int(spec.page_size_bytes)
    return -(-int(usage) // page) if page > 0 else None


def kv_cache_attributes(kv_cache_config: Any, vllm_config: Any | None) -> dict[str, Any]:
    """The ``ttft.kv.*`` attributes of one allocation: bytes allocated, the pool's blocks, vLLM's
    group-aware token capacity, and per group (in vLLM's group order) its spec, layers, tokens
    per block and blocks per ``max_model_len`` request."""
    num_blocks = int(kv_cache_config.num_blocks)
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    device_bytes, host_bytes = allocated_bytes(
        list(getattr(kv_cache_config, "kv_cache_tensors", None) or []))
    on_host = [bool(getattr(g, "host_resident", False)) for g in groups]
    sizes = [int(g.kv_cache_spec.block_size) for g in groups]
    per_request = [_blocks_per_request(g.kv_cache_spec, vllm_config) for g in groups]
    attrs: dict[str, Any] = {
        semconv.ATTR_KV_BLOCKS: num_blocks,
        semconv.ATTR_KV_BLOCK_SIZE: min(sizes) if sizes else None,
        semconv.ATTR_KV_BYTES: device_bytes,
        semconv.ATTR_KV_HOST_BYTES: host_bytes or None,
        semconv.ATTR_KV_GROUPS: len(groups),
        semconv.ATTR_KV_GROUP_SPECS: [_spec_name(_first_layer_spec(g.kv_cache_spec))
                                      for g in groups] or None,
        semconv.ATTR_KV_GROUP_LAYERS: [len(g.layer_names) for g in groups] or None,
        semconv.ATTR_KV_GROUP_BLOCK_SIZES: sizes or None,
        semconv.ATTR_KV_GROUP_BLOCKS_PER_REQUEST: None,
        semconv.ATTR_KV_MAX_CONCURRENCY: None,
        # without the runner's config (a bare runner), one group's blocks times its block size
        semconv.ATTR_KV_TOKEN_CAPACITY: num_blocks * sizes[0] if len(sizes) == 1 else None,
    }
    max_model_len = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
    if not per_request or None in per_request or not max_model_len:
        return attrs
    attrs[semconv.ATTR_KV_GROUP_BLOCKS_PER_REQUEST] = per_request
    whole = [n == -(-int(max_model_len) // size) for n, size in zip(per_request, sizes,
                                                                     strict=True)]
    attrs[semconv.ATTR_KV_SEQUENCE_GROUPS] = sum(whole)
    attrs[semconv.ATTR_KV_WINDOW_BLOCKS] = sum(n for n, w in zip(per_request, whole, strict=True)
                                               if not w)
    device_need = sum(n for n, host in zip(per_request, on_host, strict=True) if not host)
    if device_need:
        concurrency = num_blocks / device_need
        attrs[semconv.ATTR_KV_MAX_CONCURRENCY] = round(concurrency, 4)
        attrs[semconv.ATTR_KV_TOKEN_CAPACITY] = int(concurrency * int(max_model_len))
    return attrs
