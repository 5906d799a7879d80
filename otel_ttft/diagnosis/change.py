"""From a verdict to the concrete change: which vLLM flags, environment variables or driver to use,
with values computed from the evidence, and why.

Each verdict gets a ``change``: ``{"summary", "candidates": [...]}``, the candidates in the order
``otel-ttft verify`` tries them (the one the evidence points to first). A candidate names its
knobs in the installed vLLM's own words (:mod:`knobs`: its argument parser and ``vllm.envs``);
one whose knob this vLLM lacks lists it under ``missing`` and is never tried. Values come from
what was measured: KV blocks and bytes ("Allocate KV cache"), weight bytes ("Process weights after
loading"), device and host memory ("Profile run"), prompt tokens, concurrency and the server's
command template as the replay recorded it (``run.setup``).

A candidate (every key always present):
  ``id``            what kind of change (``compile-cache``, ``resident``, ``kv-budget``, ...)
  ``recommendation`` the verdict's recommendation it serves
  ``side``          ``server`` (flags/env of the models' servers), ``driver``, or ``client``
  ``models``        served names whose server command ``args``/``env`` apply to
  ``args``          vLLM flags and values; each replaces what the template set for that setting
  ``env``           environment variables for those servers
  ``durable``       names in ``env`` whose value is any durable directory (verify uses its own)
  ``driver``        the replay driver to use instead (``resident``, ``sleep``), or None
  ``sleep_level``   for the sleep driver: 1 (offload weights to host RAM) or 2 (discard)
  ``prepare``       what must happen before it can help (``fill-cache``: one start fills it;
                    ``warm-prefix``: one request as users send it, shared prefix and sampling
                    options, after each activation)
  ``gpu_only``      true where vLLM can do it only on a GPU (sleep mode, CUDA graphs)
  ``missing``       knobs the installed vLLM lacks (never tried then)
  ``replaces``      what the template said before, in its own words, by flag
  ``reason``        the evidence, in one sentence
  ``stage``         the (sub-)stage it is meant to shrink: what ``verify`` judges it by (the
                    verdict's, or e.g. ``warmup.compile`` for a compile cache offered after a
                    restart's ``keep-resident``)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis import vocabulary as knobs
from otel_ttft.diagnosis.change_evidence import (
    FILL_CACHE,
    SIDE_CLIENT,
    SIDE_DRIVER,
    SIDE_SERVER,
    WARM_PREFIX,
    Builder,
    Evidence,
)
from otel_ttft.diagnosis.change_rules import RULES

__all__ = ["FILL_CACHE", "SIDE_CLIENT", "SIDE_DRIVER", "SIDE_SERVER", "WARM_PREFIX", "change_lines",
           "describe", "propose"]


def describe(candidate: dict) -> str:
    """One line: ``VLLM_CACHE_ROOT=... --flag value`` / ``driver restart -> resident``."""
    parts = []
    if candidate.get("driver"):
        parts.append(f"driver {candidate['driver']}"
                     + (f" (level {candidate['sleep_level']})"
                        if candidate.get("sleep_level") else ""))
    parts += [f"{k}={v}" for k, v in (candidate.get("env") or {}).items()]
    if candidate.get("args"):
        parts.append(" ".join(candidate["args"]))
    replaces = candidate.get("replaces") or {}
    if replaces:
        parts.append("(was " + ", ".join(map(str, replaces.values())) + ")")
    if candidate.get("prepare") == WARM_PREFIX:
        parts.append("one request as users send it (shared prefix, their options) after "
                     "activation")
    if candidate.get("side") == SIDE_CLIENT:
        parts.append("client side")
    return " ".join(parts) or candidate.get("id", "?")


def change_lines(change: dict | None, limit: int = 20) -> list[dict[str, str]]:
    """A verdict's change for display (the report): each candidate's command-line form, its
    reason and what stops it being tried; tolerant of a hand-edited file."""
    out = []
    for c in ((change or {}).get("candidates") or [])[:limit]:
        if not isinstance(c, dict):
            continue
        notes = [f"lacks {', '.join(map(str, c.get('missing') or []))}"] if c.get(
            "missing") else []
        notes += ["GPU only"] if c.get("gpu_only") else []
        notes += ["client side, not tried"] if c.get("side") == SIDE_CLIENT else []
        try:
            line = describe(c)
        except (TypeError, AttributeError, ValueError):
            line = str(c.get("id", "?"))
        out.append({"change": line[:400], "reason": str(c.get("reason", ""))[:600],
                    "notes": "; ".join(notes)})
    return out


def propose(verdict: dict, rows: list[dict], base_rows: list[dict], run: dict,
            activations: Sequence[Any], vocab: knobs.Vocabulary | None,
            vocab_error: str | None = None) -> dict:
    """The ``change`` for one verdict."""
    rule = RULES.get(verdict.get("recommendation"))
    if rule is None:
        return {"summary": "nothing to change in the server" if verdict.get("stage") in (
            semconv.STAGE_FRONTEND, semconv.STAGE_NETWORK) else "nothing to change",
            "candidates": [], "vllm": vocab.vllm_version if vocab else None}
    ev = Evidence(verdict, rows, base_rows, run, activations, vocab)
    builder = Builder(ev)
    rule(builder)
    out = {"candidates": builder.candidates, "vllm": vocab.vllm_version if vocab else None}
    if vocab is None:
        out["unchecked"] = vocab_error or "vLLM's parser could not be read"
        for c in builder.candidates:
            if c["args"] or c["env"]:
                c["missing"].append(f"unchecked: {out['unchecked']}")
    first = next((c for c in builder.candidates if not c["missing"]), None)
    if vocab is None and builder.candidates:
        c = builder.candidates[0]
        out["summary"] = f"{describe(c)} (names unchecked: {out['unchecked']}): {c['reason']}"
    elif first is None:
        out["summary"] = ("no knob for this in the installed vLLM" if builder.candidates
                          else "no concrete change computed from this evidence")
    else:
        out["summary"] = f"{describe(first)}: {first['reason']}"
    return out
