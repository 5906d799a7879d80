"""What happened to the compile cache, and the change that prevents it: the words of a compile
miss, from the runtime's reading of the cache before the start compiled
(``runtime.compile_cache``: its ``summary``, kept in the activation's facts as
``compile_cache``).

- **empty** (or no directory): nothing under any key: deleted, cleaned, or on storage that did
  not keep it; where the directory is on a file system a restart loses (a container's own disk,
  a tmpfs) that is said, with the volume to mount.
- **other keys**: artifacts, but not under this start's key: vLLM keys them by its version,
  torch's, the configuration and the model's code, so a version or configuration change made
  them useless; fill the cache for the new key once before rollout.
- **present**: artifacts under this start's key that it compiled anyway: the traced source
  changed or the artifacts did not load; the measurement that decides is vLLM's debug log of
  the cache factors.
- **disabled**: ``VLLM_DISABLE_COMPILE_CACHE`` set.

Where the cache was not read, the words name the measurement that would decide.
"""

from __future__ import annotations

import time
from typing import Any

from otel_ttft.diagnosis.vocabulary import Vocabulary

EMPTY, MISSING, OTHER, PRESENT, UNKNOWN = "empty", "missing", "other-keys", "present", "unknown"


def _day(epoch: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch)) if isinstance(
        epoch, (int, float)) else "an earlier start"


def _named(name: str, vocab: Vocabulary | None) -> bool:
    return vocab is None or vocab.has_env(name)


def explain(cache: Any, vocab: Vocabulary | None, *, earlier_start: bool = False
            ) -> tuple[str, str] | None:
    """``(what happened, the change that prevents it)`` for a compile that missed, from the
    cache's summary; ``None`` when there is no summary to read."""
    if not isinstance(cache, dict):
        return None
    root = str(cache.get("root") or "VLLM_CACHE_ROOT")
    state = cache.get("state")
    root_var = "VLLM_CACHE_ROOT" if _named("VLLM_CACHE_ROOT", vocab) else "vLLM's cache root"
    lost = ""
    if cache.get("kept") is False:
        lost = (f"; {root} is {cache.get('kept_why') or 'on storage a restart loses'}: keep it "
                f"on a volume (docker run -v vllm-cache:{root}, or a persistent volume at "
                f"{root_var})")
    if cache.get("disabled"):
        return ("VLLM_DISABLE_COMPILE_CACHE is set: vLLM neither reads nor writes its compile "
                "cache", "unset VLLM_DISABLE_COMPILE_CACHE")
    if state in (EMPTY, MISSING):
        seen = " although an earlier start of this model here compiled into it" \
            if earlier_start else ""
        return (f"the compile cache under {root} was empty when this start began{seen} (no "
                "artifacts under any key: deleted, cleaned, or not kept across the restart)",
                f"keep {root_var}={root} on durable storage that no cache cleaner empties"
                + lost)
    if state == OTHER:
        keys = cache.get("other_keys") or []
        factors = cache.get("other_factors") or {}
        which = (f" (vLLM's config hash {factors['config_hash']})"
                 if factors.get("config_hash") else "")
        return (f"the compile cache under {root} held artifacts under {len(keys)} other "
                f"key{'s' if len(keys) != 1 else ''}{which}, newest from "
                f"{_day(cache.get('other_newest_mtime'))} UTC, but none for this start's: "
                "vLLM keys them by its version, torch's, the compile configuration and the "
                "model's code, so another vLLM or torch version or another configuration "
                "wrote them",
                f"fill {root_var} for the new version and configuration once before rollout "
                "(one start with the same cache root), and keep versions and compile settings "
                "fixed between starts" + lost)
    if state == PRESENT:
        log = "VLLM_LOGGING_LEVEL=DEBUG" if _named("VLLM_LOGGING_LEVEL", vocab) \
            else "vLLM's debug log"
        return (f"artifacts for this start's key were under {root}, yet it compiled: the traced "
                "source changed or they did not load",
                f"the measurement that decides: {log} on the next start prints the cache "
                "factors and whether it loaded the compiled graph" + lost)
    return (f"which artifacts the compile cache under {root} held before this start was not "
            "read",
            f"the measurement that decides: the listing of {root}/torch_compile_cache before "
            "the next start (otel-ttft doctor)" + lost)


def finding(current: dict, earlier_count: int, vocab: Vocabulary | None) -> dict | None:
    """A start whose compile missed the cache, after an earlier start of the same key here (which
    should have left its artifacts): what happened and the change, from the reading before the
    start. ``None`` when the compile hit, or nothing says what the cache held."""
    ev = current.get("evidence") or {}
    if ev.get("compile_cache_hit") is not False or not earlier_count:
        return None
    got = explain((current.get("facts") or {}).get("compile_cache"), vocab, earlier_start=True)
    if got is None:
        return None
    return {"what": got[0], "fix": got[1]}
