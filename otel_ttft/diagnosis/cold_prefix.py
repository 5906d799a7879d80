"""The cold prefix cache in the live verdict: a start's cold requests against the warm requests
before it, not against the earlier start's cold requests (just as cold).

The runtime measures it per request (``prefill.uncached_prefix``: the prefill of the prompt
tokens whose prefix the warm requests before the start had found in vLLM's prefix cache, and
that the cold request computed) and adds it up over the cold requests (``record["cold"]``:
``uncached_prefix_tokens``, ``prefixes``, ``warm_cached_share``, ``warm_requests``). Here it
becomes a finding when it is a material share of the cold requests' time to first token; the
fix is the warm-up: each of those prefixes once after activation, counted, never quoted.
"""

from __future__ import annotations

from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis import rule
from otel_ttft.diagnosis.change_evidence import CHAT_ROUTE
from otel_ttft.diagnosis.vocabulary import Vocabulary

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def finding(record: dict) -> dict | None:
    """The cold prefix cache of ``record``'s cold requests, when measured against a warm
    baseline and at least ``rule.MATERIAL_SHARE`` of their TTFT (and above the noise floor)."""
    cold = record.get("cold") or {}
    tokens = _int(cold.get("uncached_prefix_tokens"))
    stages = cold.get("stages") or {}
    seconds = stages.get(UNCACHED) if isinstance(stages, dict) else None
    ttft = cold.get("ttft_s")
    if not tokens or not isinstance(seconds, (int, float)) or not isinstance(ttft, (int, float)):
        return None
    if seconds < rule.NOISE_FLOOR_S or seconds < rule.MATERIAL_SHARE * ttft:
        return None
    share = cold.get("warm_cached_share")
    return {"tokens": tokens, "seconds": round(float(seconds), 6),
            "cold_ttft_s": round(float(ttft), 6), "requests": _int(cold.get("requests")),
            "prefixes": _int(cold.get("prefixes")),
            "warm_requests": _int(cold.get("warm_requests")),
            "warm_cached_share": share if isinstance(share, (int, float)) else None}


def warm_up(found: dict, vocab: Vocabulary | None) -> str:
    """The fix, in the running vLLM's route names: how many prefixes to send, where."""
    routes = vocab.routes if vocab is not None else frozenset()
    where = (f"POST {CHAT_ROUTE} with max_tokens 1" if CHAT_ROUTE in routes
             else "one completion request with max_tokens 1")
    n = found["prefixes"] or 1
    what = "prefix" if n == 1 else f"{n} prefixes"
    return (f"send the shared {what} (system prompt, history) once after each activation "
            f"({where}) before routing users, or keep the server resident")


def reason(found: dict) -> str:
    """The evidence in one sentence."""
    share = found["warm_cached_share"]
    warm = (f"; warm requests read {share:.0%} of their prompt tokens from it"
            if share is not None else "")
    return (f"the cold requests computed {found['tokens']} prompt tokens whose prefix warm "
            f"requests before this start had found in vLLM's prefix cache "
            f"({found['prefixes'] or 'their'} prefix{'es' if found['prefixes'] != 1 else ''})"
            f"{warm}: {rule.seconds_text(found['seconds'])} of their "
            f"{rule.seconds_text(found['cold_ttft_s'])} to first tokens")


def name_it(out: dict, found: dict, vocab: Vocabulary | None) -> None:
    """Put the finding on a verdict ``out`` (``activation.judge``'s): the verdict itself when
    nothing else expanded, else a second finding beside it."""
    out["prefix"] = dict(found, fix=warm_up(found, vocab), reason=reason(found))
    ev = out.setdefault("evidence", {})
    ev["cold_uncached_prefix_tokens"] = found["tokens"]
    if out["outcome"] == rule.EXPANDED:
        return
    fix, _advice = rule.fix_for(UNCACHED, semconv.STAGE_PREFILL)
    out.update(outcome=rule.EXPANDED, stage=semconv.STAGE_PREFILL, substage=UNCACHED,
               increase_s=found["seconds"], substage_increase_s=found["seconds"],
               recommendation=fix, fix=out["prefix"]["fix"],
               change_summary=f"{out['prefix']['fix']}: {out['prefix']['reason']}", change=[])
    out["against_warm"] = True


def sentence(j: dict, head: str) -> str | None:
    """The verdict's words when the cold prefix cache is the verdict; ``None`` otherwise."""
    found = j.get("prefix")
    if not found or not j.get("against_warm"):
        return None
    return (f"{head}; its cold requests met a cold prefix cache: {UNCACHED} "
            f"+{rule.seconds_text(found['seconds'])} against the warm requests before this "
            f"start ({found['reason']}); {j['recommendation']}: {found['fix']}")


def also(j: dict) -> str:
    """A second finding's words, after the verdict on the start."""
    found = j.get("prefix")
    if not found or j.get("against_warm"):
        return ""
    return (f"; also a cold prefix cache ({UNCACHED} +{rule.seconds_text(found['seconds'])}: "
            f"{found['reason']}): {rule.WARM_UP}: {found['fix']}")
