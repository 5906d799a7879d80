"""An activation (a server start) as a record the rule takes, judged against the earlier ones of
its model and configuration, and said in plain words.

A record is what one activation measured, as JSON-ready data (the runtime keeps the last few per
model in its history file; ``analyze`` builds the same from a trace):

  ``id``           the activation's trace id (32 hex)
  ``key``          model + vLLM version + the arguments that change what a start does
  ``model``, ``kind`` (start | wake), ``at`` (epoch seconds)
  ``duration_s``   start -> ready
  ``stages``       seconds per stage value (``warmup.compile``, ``load``, ...): the activation's
                   interval tiled by its stage spans, the most specific at each instant
  ``evidence``     what tells a cold read from a warm one (``bytes_read`` from storage, the
                   page-cache share, ``compile_cache_hit``)
  ``facts``        what a concrete change is sized by (``FACT_ATTRIBUTES``)
  ``cold``         once its first requests are done: ``{"requests", "ttft_s", "stages"}``
  ``ranks``        with several workers: ``{"gate", "skews"}`` (``ranks``): the rank that gated
                   the start, if one fell behind the others, and each stage's skew

Each activation is one record of the rule (``rule.verdict``), its duration standing for the
TTFT; the earlier ones are the baseline. Three or more measure the noise as for requests; one or
two are a thin baseline, judged by the alert rules' thresholds (``thresholds``); none is "no
baseline".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis import change, cold_prefix, compile_fix, prefix, ranks, rule
from otel_ttft.diagnosis.record import (  # noqa: F401 - the record's shape, named here too
    FACT_ATTRIBUTES,
    Interval,
    stage_seconds,
    valid_record,
)
from otel_ttft.diagnosis.thresholds import ALERT_THRESHOLDS, AlertThresholds
from otel_ttft.diagnosis.vocabulary import Vocabulary

BASELINE_NONE, BASELINE_THIN, BASELINE_MEASURED = "none", "thin", "measured"
MAX_EARLIER = 20  # the most recent earlier activations compared with

_PHASES = semconv.VERDICT_PHASES


def _phase_stages(record: dict, phase: str) -> tuple[float, dict[str, float]]:
    stages = dict(record["stages"])
    total = float(record["duration_s"])
    if phase == semconv.VERDICT_PHASE_COLD_REQUESTS and record.get("cold"):
        total += float(record["cold"]["ttft_s"])
        for k, v in record["cold"]["stages"].items():
            stages[k] = stages.get(k, 0.0) + float(v)
    return total, stages


def as_row(record: dict, phase: str = semconv.VERDICT_PHASE_READY) -> dict:
    """The rule's record for one activation: its duration as the TTFT, stage families (every
    stage of ``rule.PIPELINE``) and sub-stages, evidence."""
    total, stages = _phase_stages(record, phase)
    families = dict.fromkeys(rule.PIPELINE, 0.0)
    substages: dict[str, float] = {}
    for key, seconds in stages.items():
        family = semconv.stage_family(key)
        if family in families:
            families[family] += seconds
            if key != family:
                substages[key] = substages.get(key, 0.0) + seconds
    ev = record.get("evidence") or {}
    row = {"client_ttft_s": total, "stages": families, "substages": substages,
           "model": record.get("model"), "prompt_tokens": None, "waiting_at_arrival": None,
           "evidence": {"bytes_read": ev.get("bytes_read") or 0,
                        "page_cache_resident_ratio": ev.get("page_cache_resident_ratio"),
                        "compile_cache_hit": ev.get("compile_cache_hit"),
                        "model_was_resident": False}}
    cold = record.get("cold") or {}
    if phase == semconv.VERDICT_PHASE_COLD_REQUESTS and _tokens(cold.get("prompt_tokens")) \
            and _tokens(cold.get("cached_tokens")) is not None:
        # the cold requests' prompts, one label for all: their prefix-cache share is compared
        # with the earlier activations' (``prefix``)
        row.update(prompt=COLD_PROMPTS, prompt_tokens=cold["prompt_tokens"])
        row["evidence"]["cached_tokens"] = min(cold["cached_tokens"], cold["prompt_tokens"])
    return row


COLD_PROMPTS = "cold requests"


def _tokens(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


@dataclass(frozen=True)
class ActivationFacts:
    """What ``change`` reads of an activation (as of ``breakdown.ActivationSummary``)."""

    model: str | None
    facts: dict[str, Any] = field(default_factory=dict)
    bytes_read: int = 0


def judge(current: dict, earlier: Sequence[dict], *, phase: str = semconv.VERDICT_PHASE_READY,
          vocab: Vocabulary | None = None, vocab_error: str | None = None,
          thresholds: AlertThresholds = ALERT_THRESHOLDS) -> dict:
    """The verdict on ``current`` against the earlier records of its key (oldest first; those
    of another key, or without the phase's data, are left out), with its change and its
    sentence. Keys: phase, outcome, baseline, baseline_count, duration_s, baseline_s, last_s,
    best_s, stage, substage, increase_s (the stage's), substage_increase_s (the sub-stage's own,
    where it is one), recommendation, fix, change (flags and environment
    variables), change_summary, summary (the plain words), verdict (the rule's own)."""
    cold = phase == semconv.VERDICT_PHASE_COLD_REQUESTS
    base = [r for r in earlier if r.get("key") == current.get("key")
            and r.get("id") != current.get("id") and (not cold or r.get("cold"))][-MAX_EARLIER:]
    duration, _ = _phase_stages(current, phase)
    out: dict[str, Any] = {
        "phase": phase, "model": current.get("model"), "kind": current.get("kind") or "start",
        "duration_s": round(duration, 6), "baseline_count": len(base), "stage": rule.NONE,
        "substage": None, "increase_s": 0.0, "recommendation": rule.NONE, "fix": "",
        "change": [], "change_summary": "", "verdict": None,
        "top_stages": _top(current, phase), "evidence": dict(current.get("evidence") or {}),
        "rank_gate": rank_gate(current)}
    # measured against the warm requests before this start (the runtime's prefix baseline)
    found = cold_prefix.finding(current) if cold else None
    if not base:
        out.update(outcome=semconv.VERDICT_NO_BASELINE, baseline=BASELINE_NONE,
                   baseline_s=None, last_s=None, best_s=None)
        if found:
            cold_prefix.name_it(out, found, vocab)
        out["summary"] = sentence(out)
        return out
    rows = [as_row(r, phase) for r in base]
    totals = [r["client_ttft_s"] for r in rows]
    thin = len(base) < rule.MIN_BASELINE_N
    # cold requests' prefill of prompt tokens the earlier activations' cold requests read from
    # the prefix cache: named as the uncached prefix, as ``analyze`` names it
    measured = "uncached_prefix_tokens" in (current.get("cold") or {})
    (now,) = (prefix.split([as_row(current, phase)], rows) if cold and not measured
              else [as_row(current, phase)])
    for key in ("cached_tokens", "uncached_prefix_tokens", "baseline_cached_share"):
        if key in now["evidence"]:  # what the cold requests read from the prefix cache
            out["evidence"][f"cold_{key}"] = now["evidence"][key]
    v = rule.verdict(f"this {out['kind']}", f"the earlier {out['kind']}s", [now],
                     rows, thin=thresholds if thin else None)
    out.update(outcome=v["outcome"], baseline=BASELINE_THIN if thin else BASELINE_MEASURED,
               baseline_s=round(rule.median(totals), 6), last_s=round(totals[-1], 6),
               best_s=round(min(totals), 6), verdict=v)
    if v["outcome"] == rule.EXPANDED:
        fix, advice = rule.fix_for(v["substage"], v["stage"])
        proposal = change.propose(v, [now], rows, {}, [
            ActivationFacts(current.get("model"), dict(current.get("facts") or {}),
                            int((current.get("evidence") or {}).get("bytes_read") or 0))],
            vocab, vocab_error)
        usable = [c for c in proposal["candidates"] if not c["missing"]]
        # a server's own start: a change it can make (flags, environment, a command) before a
        # replay driver's (resident, sleep), which a start has no driver for
        concrete = [c for c in usable if not c.get("driver")] or usable
        first = concrete[0] if concrete else None
        sub = v["substage"]
        if sub and sub != v["stage"]:
            out["substage_increase_s"] = round(now["substages"].get(sub, 0.0) - rule.median(
                [r["substages"].get(sub, 0.0) for r in rows]), 6)
        out.update(stage=v["stage"], substage=v["substage"], increase_s=v["delta_s"],
                   recommendation=fix, fix=advice, change_summary=proposal.get("summary", ""),
                   change=_knobs(first) if first else [])
        if first is not None and not out["change"] and first["side"] != change.SIDE_CLIENT:
            out["fix"] = first["reason"]  # a command, not a flag: its words are the fix
        out["alternatives"] = _alternatives(proposal["candidates"], first, vocab)
    if found:
        cold_prefix.name_it(out, found, vocab)
    lost = compile_fix.finding(current, len(base), vocab)
    if lost and out.get("substage") != semconv.STAGE_WARMUP_COMPILE:  # else the change says it
        out["compile_cache"] = lost
    out["summary"] = sentence(out)
    return out


def _alternatives(candidates: list[dict], first: dict | None, vocab: Vocabulary | None,
                  n: int = 3) -> list[str]:
    """The other server-side changes in the installed vLLM's words, with the package a loader
    needs where it is not known to be installed (a flag this vLLM lacks is never offered)."""
    out = []
    for c in candidates:
        knobs = _knobs(c)
        packages = vocab.loader_packages if vocab is not None else {}
        lacks = [m for m in c["missing"] if m in packages]
        if c is first or not knobs or c.get("driver") or len(lacks) != len(c["missing"]):
            continue
        out.append(" ".join(knobs) + (f" (needs {', '.join(lacks)} installed)" if lacks else ""))
    return out[:n]


def rank_gate(record: dict) -> dict | None:
    """The worker rank that gated this activation (``ranks.gate``), if the record has one."""
    found = record.get("ranks")
    gate = found.get("gate") if isinstance(found, dict) else None
    return gate if ranks.valid_gate(gate) else None


def _knobs(candidate: dict) -> list[str]:
    """A candidate's change as vLLM reads it: ``NAME=value`` environment, then flags."""
    return [f"{k}={v}" for k, v in (candidate.get("env") or {}).items()] + list(
        candidate.get("args") or [])


def _top(record: dict, phase: str, n: int = 3) -> list[tuple[str, float]]:
    _, stages = _phase_stages(record, phase)
    return sorted(stages.items(), key=lambda kv: -kv[1])[:n]


def _cause(j: dict) -> str:
    ev = j.get("evidence") or {}
    where = (j.get("substage") or j.get("stage") or "")
    if where == semconv.STAGE_WARMUP_COMPILE and ev.get("compile_cache_hit") is False:
        cache = ev.get("compile_cache_dir")
        return " (the compile cache missed" + (f", cache under {cache}" if cache else "") + ")"
    if where == semconv.STAGE_LOAD_READ and ev.get("page_cache_resident_ratio") is not None:
        return (f" (checkpoint {ev['page_cache_resident_ratio']:.0%} in the page cache before "
                "its reads)")
    return ""


def sentence(j: dict) -> str:
    """The verdict in plain words, for the server's log and ``ttft.verdict.summary``."""
    gate = j.get("rank_gate")
    return _sentence(j) + (f"; {ranks.sentence(gate)}" if gate else "")


def _sentence(j: dict) -> str:
    s = rule.seconds_text
    kind = j.get("kind") or "start"
    what = f"this {kind}" + (f" of {j['model']}" if j.get("model") else "")
    until = " to its cold requests' first tokens" if j["phase"] == _PHASES[1] else ""
    head = f"otel-ttft: {what} took {s(j['duration_s'])}{until}"
    prefix_words = cold_prefix.sentence(j, head)
    if prefix_words is not None:
        return prefix_words
    if j["outcome"] == semconv.VERDICT_NO_BASELINE:
        measured = ", ".join(f"{k} {s(v)}" for k, v in j.get("top_stages") or [])
        return (f"{head}; no baseline yet: the first {kind} of this model and configuration on "
                f"this host" + (f" (most in {measured})" if measured else ""))
    delta = j["duration_s"] - j["last_s"]
    head += (f", {s(abs(delta))} {'more' if delta >= 0 else 'less'} than the last {kind} of this "
             f"model ({s(j['last_s'])}; median of {j['baseline_count']} earlier "
             f"{s(j['baseline_s'])}, best {s(j['best_s'])})")
    thin = (f"; thin baseline ({j['baseline_count']} earlier), judged by the alert thresholds"
            if j["baseline"] == BASELINE_THIN else "")
    compiled = (f"; the compile missed: {j['compile_cache']['what']}; "
                f"{j['compile_cache']['fix']}" if j.get("compile_cache") else "")
    if j["outcome"] != rule.EXPANDED:
        return head + "; no stage grew beyond the noise" + thin + compiled
    where = f"{j['stage']} +{s(j['increase_s'])}"
    if j.get("substage_increase_s") is not None:
        where = f"{j['substage']} +{s(j['substage_increase_s'])} ({where} in all)"
    fix = " ".join(j["change"]) if j["change"] else j["fix"]
    why = ""
    if j["change"] and j.get("change_summary"):
        why = j["change_summary"].partition(": ")[2]
    if j.get("alternatives"):
        fix += "; or " + "; or ".join(j["alternatives"])
    return (f"{head}; earliest stage that grew: {where}{_cause(j)}; "
            f"{j['recommendation']}: {fix}" + (f" ({why})" if why else "") + thin
            + cold_prefix.also(j) + compiled)
