"""The live verdict as it is said: the ``ttft.verdict.*`` attributes of its span, the log line
in the server's log and the gauge's observation (``activation_verdict`` takes it, emits them)."""

from __future__ import annotations

import logging
from typing import Any

from otel_ttft import semconv

# vLLM's own logger tree, so the verdict prints in the server's log as its lines do
logger = logging.getLogger("vllm.otel_ttft")


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
    gate = result.get("rank_gate")
    if gate:
        optional.update({semconv.ATTR_VERDICT_RANK: gate["rank"],
                         semconv.ATTR_VERDICT_RANK_STAGE: gate["stage"],
                         semconv.ATTR_VERDICT_RANK_SKEW_S: float(gate["skew_s"])})
    attrs.update({k: v for k, v in optional.items() if v is not None})
    return attrs


def _report(result: dict, trace_hex: str) -> dict:
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
