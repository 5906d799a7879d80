"""The prefix cache is part of a cold model: the prefill a request spent on prompt tokens that the
baseline found in vLLM's prefix cache for the same prompt, and this request computed.

vLLM serves with automatic prefix caching: a chat deployment's system prompt and history come
from the cache after the first request. A new process, or a wake-up that dropped the KV cache,
starts with it empty, and the first requests pay the whole prefill again. The article's rule
then sees ``prefill`` grow and says "tune the context", when the switch emptied the cache.

Per request, the tokens it computed beyond what the baseline computed for the same prompt (the
same replay prompt, so the same shared prefix) are ``expected cached - cached``, where expected
cached is the baseline's cached share (median of ``gen_ai.usage.cache_read.input_tokens`` /
prompt tokens) of this request's prompt tokens. The prefill time they cost is prefill x extra /
tokens computed: prefill time is taken as linear in the tokens computed (vLLM reports tokens,
not time per token; the prefix's tokens attend to fewer keys than the tail's, so a linear split
if anything overstates the tail's share, never invents the prefix's). That time becomes the
sub-stage ``prefill.uncached_prefix``; the rest stays ``prefill``. Requests without a prompt
label (live traffic) or without cached-token counts are left as they are: no prefix is assumed
to be shared without a measurement that says so.
"""

from __future__ import annotations

import copy
import math
import statistics

from otel_ttft import semconv

__all__ = ["baseline_shares", "split", "uncached_tokens"]

UNCACHED = semconv.STAGE_PREFILL_UNCACHED_PREFIX


def _cached(row: dict) -> int | None:
    value = (row.get("evidence") or {}).get("cached_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _prompt_tokens(row: dict) -> int | None:
    value = row.get("prompt_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def baseline_shares(base_rows: list[dict]) -> dict[str, float]:
    """Per replay prompt (``short``, ``long``, ...): the median share of its prompt tokens the
    baseline's requests read from the prefix cache."""
    shares: dict[str, list[float]] = {}
    for row in base_rows:
        prompt, tokens, cached = row.get("prompt"), _prompt_tokens(row), _cached(row)
        if isinstance(prompt, str) and tokens and cached is not None:
            shares.setdefault(prompt, []).append(min(cached, tokens) / tokens)
    return {p: statistics.median(v) for p, v in shares.items()}


def uncached_tokens(prompt_tokens: int, cached: int, base_share: float) -> int:
    """Prompt tokens the baseline's cached share says were cached, that this request computed."""
    expected = math.floor(base_share * prompt_tokens)
    return max(0, min(expected - cached, prompt_tokens - cached))


def split(rows: list[dict], base_rows: list[dict]) -> list[dict]:
    """``rows`` with the prefill of their uncached prefix as its own sub-stage (copies; the
    input is left alone). Each split row's evidence gains ``uncached_prefix_tokens`` and the
    baseline's ``baseline_cached_share``; the stage totals do not change."""
    shares = baseline_shares(base_rows)
    out = []
    for row in rows:
        share = shares.get(row.get("prompt")) if isinstance(row.get("prompt"), str) else None
        tokens, cached = _prompt_tokens(row), _cached(row)
        if share is None or not tokens or cached is None:
            out.append(row)
            continue
        extra = uncached_tokens(tokens, cached, share)
        row = copy.deepcopy(row)
        row["evidence"]["uncached_prefix_tokens"] = extra
        row["evidence"]["baseline_cached_share"] = round(share, 4)
        prefill = (row.get("stages") or {}).get(semconv.STAGE_PREFILL, 0.0)
        computed = tokens - cached
        seconds = round(prefill * extra / computed, 6) if extra and computed else 0.0
        plain = row["substages"].get(semconv.STAGE_PREFILL)
        if seconds > 0:
            row["substages"][UNCACHED] = seconds
            if plain is not None:  # the tiling's own plain prefill gives up that time
                rest = round(plain - seconds, 6)
                if rest > 0:
                    row["substages"][semconv.STAGE_PREFILL] = rest
                else:
                    row["substages"].pop(semconv.STAGE_PREFILL, None)
            row["substages"] = dict(sorted(row["substages"].items()))
            if row.get("segments"):
                row["segments"] = _split_segments(row["segments"], seconds)
        out.append(row)
    return out


def _split_segments(segments: list[dict], seconds: float) -> list[dict]:
    """The first ``seconds`` of the plain prefill segments become the uncached prefix: a
    prompt's tokens are prefilled in order, its (shared) prefix first."""
    out, left = [], seconds
    for seg in segments:
        if left <= 0 or seg.get("substage") != semconv.STAGE_PREFILL:
            out.append(seg)
            continue
        head = min(left, seg["duration_s"])
        out.append({**seg, "substage": UNCACHED, "duration_s": round(head, 6)})
        if seg["duration_s"] - head > 0:
            out.append({**seg, "start_s": round(seg["start_s"] + head, 6),
                        "duration_s": round(seg["duration_s"] - head, 6)})
        left -= head
    return out
