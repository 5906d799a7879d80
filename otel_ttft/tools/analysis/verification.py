"""The outcome of one verification (``otel-ttft verify``): before and after numbers against the
same baseline, whether the change is verified, and the line that says so. Pure: the re-runs are
``replay/verify_run.py``'s.

verified = the TTFT p50 fell by more than the noise (the verdict's: 3 standard errors, from the
baseline's spread, of the difference of the two medians) **and** the blamed stage (the one the
change is meant to shrink) fell by more than its own noise and 10 % of what it was. regressed =
the TTFT grew beyond the noise and 10 %.
"""

from __future__ import annotations

import math
import statistics
from typing import TextIO

from otel_ttft import semconv
from otel_ttft.tools.analysis import verdict
from otel_ttft.tools.analysis.tree import format_duration

STATUS_VERIFIED, STATUS_NOT_VERIFIED = "verified", "not-verified"
STATUS_FAILED, STATUS_NOT_TRIED = "failed", "not-tried"


def finish(v: dict, record: dict, before: list[dict], after: list[dict], base: list[dict]
           ) -> dict:
    """``record`` completed from the original, re-run and baseline requests: numbers, outcome,
    the new verdict and the one-line summary (pure: unit-tested)."""
    record.update(compare(v, before, after, base, (record.get("candidate") or {}).get("stage")))
    new_verdict = record.pop("_new")
    record["new_verdict"] = {k: new_verdict.get(k) for k in
                             ("stage", "substage", "recommendation", "summary")}
    fmt = format_duration
    numbers = (f"{v['scenario']} {fmt(record['ttft_p50_before_s'])} -> "
               f"{fmt(record['ttft_p50_after_s'])} ({record['stage']} "
               f"{fmt(record['stage_before_s'])} -> {fmt(record['stage_after_s'])})")
    if record["verified"]:
        record["summary"] = f"verified: {numbers} with {record['change']}"
    else:
        record["summary"] = f"not verified: {numbers} with {record['change']}: {record['reason']}"
    return record


def _noise(base: list[float], floor: float, n_before: int, n_after: int) -> float:
    """The verdict's noise for the difference of two medians, before and after, of runs of
    ``n_before`` and ``n_after`` requests: sigma from the warm baseline's repeats (the
    scenario's own spread is its design, not noise), times sqrt(1/n + 1/m)."""
    scale = math.sqrt(1 / max(n_before, 1) + 1 / max(n_after, 1))
    return max(floor, verdict.NOISE_K * 1.2533 * verdict.spread(base) * scale)


def compare(v: dict, before: list[dict], after: list[dict], base: list[dict],
            stage: str | None = None) -> dict:
    """Before/after numbers of one verification and its outcome; ``stage``: what the change is
    meant to shrink (default: the verdict's sub-stage, else its stage)."""
    def p50(rows: list[dict], key: str) -> float:
        return statistics.median([(r.get("substages") or {}).get(key, r["stages"].get(key, 0.0))
                                  for r in rows]) if rows else 0.0

    blamed = stage if isinstance(stage, str) and stage else v.get("substage") or v.get("stage")
    base_ttft = [r["client_ttft_s"] for r in base]
    floor = max(verdict.NOISE_FLOOR_S, verdict.NOISE_FLOOR_SHARE * verdict.median(base_ttft))
    noise = _noise(base_ttft, floor, len(before), len(after))
    t0 = verdict.median([r["client_ttft_s"] for r in before])
    t1 = verdict.median([r["client_ttft_s"] for r in after])
    s0, s1 = p50(before, blamed), p50(after, blamed)
    stage_noise = _noise([(r.get("substages") or {}).get(blamed, r["stages"].get(blamed, 0.0))
                          for r in base], floor, len(before), len(after))
    fell = t0 - t1 > noise
    shrank = s0 - s1 > max(stage_noise, verdict.MATERIAL_SHARE * s0)
    regressed = t1 - t0 > max(noise, verdict.MATERIAL_SHARE * t0)
    new = verdict.verdict(v["scenario"], v.get("baseline") or "", after, base) if base else {
        "stage": None, "substage": None, "recommendation": None, "summary": None}
    reason = None
    if not fell:
        reason = (f"TTFT did not fall beyond the noise ({format_duration(noise)})"
                  + ("; it got worse" if regressed else ""))
    elif not shrank:
        reason = f"{blamed} did not shrink"
    return {
        "status": STATUS_VERIFIED if fell and shrank else STATUS_NOT_VERIFIED,
        "verified": fell and shrank, "regressed": regressed, "reason": reason,
        "ttft_p50_before_s": round(t0, 6), "ttft_p50_after_s": round(t1, 6),
        "noise_s": round(noise, 6), "stage": blamed,
        "stage_before_s": round(s0, 6), "stage_after_s": round(s1, 6),
        "stages_p50_before": {s: round(p50(before, s), 6) for s in semconv.TTFT_PIPELINE},
        "stages_p50_after": {s: round(p50(after, s), 6) for s in semconv.TTFT_PIPELINE},
        "_new": new,
    }


def print_verifications(doc: dict, out: TextIO, *, table: bool = True) -> None:
    """The table, each verdict with its change, then one line per verification."""
    from otel_ttft.tools.analysis.render import print_analysis

    if table:
        print_analysis(doc, out)
    records = doc.get("verifications") or []
    print("", file=out)
    print("Verifications (each change tried through the same replay, against the same "
          "baseline):", file=out)
    for r in records:
        print(f"- {r['summary']}", file=out)
