"""Activations read from a trace as the live verdict's records, so that ``analyze``'s side of the
house (its tiling of a trace, ``breakdown``) and the runtime's (its ledger) are judged by the one
rule, ``otel_ttft.diagnosis.activation``."""

from __future__ import annotations

from otel_ttft.diagnosis import activation as diagnosis
from otel_ttft.diagnosis import ranks
from otel_ttft.tools.analysis.breakdown import ActivationSummary


def record(summary: ActivationSummary, key: str, at: float | None = None) -> dict:
    """One activation of a trace as a history record (``diagnosis.activation``): its stages from
    the analysis tiling of the trace, its evidence and facts from the spans' attributes."""
    stages: dict[str, float] = {}
    for start, end, stage in summary.segments:
        stages[stage] = stages.get(stage, 0.0) + (end - start) / 1e9
    ratio = summary.resident_ratio
    storage = summary.bytes_read * (1.0 - ratio) if ratio is not None else summary.bytes_read
    return {
        "id": summary.trace_id, "key": key, "model": summary.model, "kind": summary.kind,
        "at": at if at is not None else summary.start_ns / 1e9,
        "duration_s": (summary.end_ns - summary.start_ns) / 1e9,
        "stages": stages,
        "evidence": {"bytes_read": int(storage), "page_cache_resident_ratio": ratio,
                     "compile_cache_hit": summary.compile_cache_hit,
                     "compile_cache_dir": summary.facts.get("compile_cache_dir")},
        "facts": dict(summary.facts),
        "ranks": ({"gate": summary.rank_gate, "skews": summary.rank_skews}
                  if summary.rank_skews else None),
    }


def gated(activations: list[ActivationSummary]) -> list[dict]:
    """The activations one worker rank gated (``diagnosis.ranks``), for ``analyze``'s document:
    trace id, model, duration and the gate, oldest first."""
    return [{"trace_id": a.trace_id, "model": a.model, "kind": a.kind,
             "duration_s": round((a.end_ns - a.start_ns) / 1e9, 6), "rank_gate": a.rank_gate,
             "summary": ranks.sentence(a.rank_gate)}
            for a in sorted(activations, key=lambda a: a.start_ns) if a.rank_gate]


def judge(summary: ActivationSummary, earlier: list[dict], key: str, **kwargs) -> dict:
    """The verdict on one activation of a trace against earlier records of its key."""
    return diagnosis.judge(record(summary, key), earlier, **kwargs)
