"""Numbers as an operator reads them: the report's labels and units for every evidence key.

The analysis JSON keeps machine names (``baseline_model_was_resident_share``, seconds, bytes);
the page shows words and units (ms, MB, GB/s, %). A key this table does not know (a later
writer's) is still shown in words, its unit read off its suffix, never as the raw name.
"""

from __future__ import annotations

import math
from typing import Any

# key -> (label, unit). Units: s (duration), ds (signed duration), bytes, gbps, share, count,
# tokens, bool, text.
EVIDENCE: dict[str, tuple[str, str]] = {
    "n": ("requests", "count"),
    "baseline_n": ("baseline requests", "count"),
    "ttft_delta_s": ("TTFT change (median)", "ds"),
    "noise_s": ("noise (3 standard errors)", "s"),
    "stage_noise_s": ("noise of the named stage", "s"),
    "bytes_read_p50": ("checkpoint read (median)", "bytes"),
    "baseline_bytes_read_p50": ("baseline checkpoint read", "bytes"),
    "read_gb_per_s_p50": ("read throughput (median)", "gbps"),
    "page_cache_resident_ratio_p50": ("in page cache at read", "share"),
    "checkpoint_resident_before_start": ("in page cache right before the switch", "share"),
    "cold": ("cold read (checked)", "bool"),
    "compile_cache_hit": ("compile cache hit", "bool"),
    "model_was_resident_share": ("requests on a resident model", "share"),
    "baseline_model_was_resident_share": ("baseline requests on a resident model", "share"),
    "among_first_requests_share": ("requests among their server's first", "share"),
    "baseline_among_first_requests_share": ("baseline requests among their server's first",
                                            "share"),
    "middle_half_ttft_delta_s": ("TTFT change, middle half of requests", "ds"),
    "prompt_tokens_p50": ("prompt tokens (median)", "tokens"),
    "baseline_prompt_tokens_p50": ("baseline prompt tokens", "tokens"),
    "waiting_at_arrival_p50": ("requests waiting at arrival", "count"),
    "baseline_waiting_at_arrival_p50": ("baseline requests waiting at arrival", "count"),
}
# Shown elsewhere on the card (bars, the note), not as a fact row.
SHOWN_APART = frozenset({"stage_deltas_s", "note"})


def fmt_s(seconds: float) -> str:
    """Seconds as an operator reads them: 12.3 s, 1.23 s, 456 ms, 7.8 ms, 0.12 ms."""
    a = abs(seconds)
    if a >= 10:
        return f"{seconds:.1f} s"
    if a >= 1:
        return f"{seconds:.2f} s"
    if a >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    if a >= 0.001:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.2f} ms"


def fmt_signed_s(seconds: float) -> str:
    return ("+" if seconds >= 0 else "\u2212") + fmt_s(abs(seconds))


def fmt_bytes(n: float) -> str:
    """Decimal units, as storage is sold: 11.0 MB, 4.20 GB."""
    a = abs(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if a >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def _unit_of(key: str) -> str:
    for suffix, unit in (("gb_per_s", "gbps"), ("_seconds", "s"), ("_s", "s"),
                         ("_bytes", "bytes"), ("bytes_read", "bytes"), ("_share", "share"),
                         ("_ratio", "share"), ("_tokens", "tokens")):
        if key.endswith(suffix) or key.rsplit("_p50", 1)[0].endswith(suffix):
            return unit
    return "text"


def label_of(key: str) -> str:
    """A key in words: the table's label, else its parts ("read_retry_count" -> "read retry
    count"), the unit suffix dropped."""
    if key in EVIDENCE:
        return EVIDENCE[key][0]
    words = key
    for suffix in ("_p50", "_gb_per_s", "_seconds", "_s", "_bytes", "_ratio", "_share"):
        if words.endswith(suffix) and len(words) > len(suffix):
            words = words[: -len(suffix)]
    words = words.replace("_", " ").replace(".", " ").strip()
    return (words[:1].upper() + words[1:]) if words else "value"


MAX_DEPTH = 3  # nesting shown in words; deeper structures are elided


def fmt_value(key: str, value: Any, limit: int = 300, depth: int = 0) -> str:
    """One evidence value in its unit; structures as short readable text, never raw JSON."""
    unit = EVIDENCE.get(key, (None, _unit_of(key)))[1]
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and math.isfinite(value):
        if unit == "s":
            return fmt_s(value)
        if unit == "ds":
            return fmt_signed_s(value)
        if unit == "bytes":
            return fmt_bytes(value)
        if unit == "gbps":
            return f"{value:.2f} GB/s" if value >= 0.1 else f"{value * 1000:.0f} MB/s"
        if unit == "share":
            return f"{value:.0%}"
        if isinstance(value, float) and not value.is_integer():
            return f"{value:.4g}"
        return f"{int(value):,}" if unit in ("count", "tokens") else str(int(value))
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return "(nested too deeply to show)"
    if isinstance(value, dict):
        parts = [f"{label_of(str(k)).lower()} {fmt_value(str(k), v, 80, depth + 1)}"
                 for k, v in list(value.items())[:20]]
        return _short("; ".join(parts), limit)
    if isinstance(value, (list, tuple)):
        return _short(", ".join(fmt_value(key, v, 80, depth + 1) for v in value[:20]), limit)
    return _short(value if isinstance(value, str) else str(value), limit)


def facts(evidence: dict[str, Any], limit: int = 40) -> list[tuple[str, str]]:
    """(label, formatted value) for every evidence entry the card shows as a fact."""
    return [(label_of(k), fmt_value(k, v)) for k, v in list(evidence.items())[:limit]
            if k not in SHOWN_APART]


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"
