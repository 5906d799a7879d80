"""The live verdict's key: the arguments a start is compared by (and its logger)."""

from __future__ import annotations

import logging
import sys
from typing import Any

# vLLM's own logger tree, so the verdict prints in the server's log as its lines do
logger = logging.getLogger("vllm.otel_ttft")

# Arguments that change what a start does (and so what it is compared with); the cache
# directories are left out on purpose: a changed cache is a cause to find, not a new baseline.
_KEY_FIELDS = {
    "model_config": ("model", "revision", "dtype", "max_model_len", "quantization",
                     "enforce_eager", "tokenizer"),
    "parallel_config": ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"),
    "cache_config": ("block_size", "cache_dtype", "kv_cache_memory_bytes"),
    "scheduler_config": ("max_num_seqs", "max_num_batched_tokens"),
    "load_config": ("load_format",),
    "compilation_config": ("mode", "cudagraph_mode"),
    "device_config": ("device_type",),
}



def config_summary(vllm_config: Any) -> dict[str, str]:
    """The arguments a start is compared by, as strings, with vLLM's and torch's versions."""
    out: dict[str, str] = {}
    for part, names in _KEY_FIELDS.items():
        section = getattr(vllm_config, part, None)
        for name in names:
            value = getattr(section, name, None) if section is not None else None
            if value is not None:
                out[f"{part}.{name}"] = str(value)[:200]
    out["lora"] = str(getattr(vllm_config, "lora_config", None) is not None)
    for module in ("vllm", "torch"):
        version = getattr(sys.modules.get(module), "__version__", None)
        if version:
            out[f"{module}.version"] = str(version)
    return out


def key(summary: dict[str, str]) -> str:
    """A short digest of the arguments: the history's key."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16]


def served_name(vllm_config: Any) -> str | None:
    model = getattr(vllm_config, "model_config", None)
    name = getattr(model, "served_model_name", None) or getattr(model, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return str(name) if name else None
