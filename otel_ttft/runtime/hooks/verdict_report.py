"""The live verdict's outputs and its key: the ``ttft.verdict.*`` attributes of a verdict span,
the log line and the gauge's observation (``activation_verdict`` emits them), and the arguments a
start is compared by."""

from __future__ import annotations

import logging
import sys
from typing import Any

from otel_ttft import semconv

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


def attributes(result: dict) -> dict[str, Any]:
    """The ``ttft.verdict.*`` attributes of one verdict."""
    attrs: dict[str, Any] = {
        semconv.ATTR_VERDICT_PHASE: result["phase"],
        semconv.ATTR_VERDICT_OUTCOME: result["outcome"],
        semconv.ATTR_VERDICT_BASELINE: result["baseline"],
        semconv.ATTR_VERDICT_BASELINE_COUNT: result["baseline_count"],
        semconv.ATTR_VERDICT_STAGE: result["stage"],
        semconv.ATTR_VERDICT_INCREASE_S: float(result["increase_s"]),
        semconv.ATTR_VERDICT_DURATION_S: float(result["duration_s"]),
        semconv.ATTR_VERDICT_RECOMMENDATION: result["recommendation"],
        semconv.ATTR_VERDICT_SUMMARY: result["summary"],
    }
    optional = {semconv.ATTR_VERDICT_SUBSTAGE: result.get("substage"),
                semconv.ATTR_VERDICT_SUBSTAGE_INCREASE_S: result.get("substage_increase_s"),
                semconv.ATTR_VERDICT_BASELINE_S: result.get("baseline_s"),
                semconv.ATTR_VERDICT_LAST_S: result.get("last_s"),
                semconv.ATTR_VERDICT_BEST_S: result.get("best_s"),
                semconv.ATTR_VERDICT_FIX: result.get("fix") or None,
                semconv.ATTR_VERDICT_CHANGE: list(result.get("change") or ()) or None,
                semconv.ATTR_VERDICT_COLD_CACHED_TOKENS:
                    (result.get("evidence") or {}).get("cold_cached_tokens"),
                semconv.ATTR_VERDICT_COLD_UNCACHED_PREFIX_TOKENS:
                    (result.get("evidence") or {}).get("cold_uncached_prefix_tokens")}
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def report(result: dict, trace_hex: str) -> dict:
    """The log line; returns the gauge's observation (value and labels)."""
    line = result["summary"]
    if result.get("history_problem"):
        line += f" [history: {result['history_problem']}]"
    if result.get("vocabulary_note"):
        line += f" [{result['vocabulary_note']}]"
    level = logging.WARNING if result["outcome"] == "expanded" else logging.INFO
    logger.log(level, "%s (trace %s)", line, trace_hex)
    labels = {semconv.ATTR_STAGE: result["stage"],
              semconv.ATTR_VERDICT_SUBSTAGE: result.get("substage") or result["stage"],
              semconv.ATTR_VERDICT_RECOMMENDATION: result["recommendation"],
              semconv.ATTR_VERDICT_CHANGE: " ".join(result.get("change") or ())[:200],
              semconv.ATTR_VERDICT_OUTCOME: result["outcome"],
              semconv.ATTR_VERDICT_BASELINE: result["baseline"],
              semconv.ATTR_VERDICT_PHASE: result["phase"],
              semconv.ATTR_ACTIVATION_TRACE_ID: trace_hex}
    if result.get("model"):
        labels[semconv.GEN_AI_REQUEST_MODEL] = result["model"]
    return {"value": float(result["increase_s"]), "labels": labels}
