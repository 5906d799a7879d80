"""What warm requests found in vLLM's prefix cache, kept across restarts and wake-ups: the
baseline a cold prefix cache is measured against.

A restart (or a wake-up that dropped the KV cache) empties vLLM's prefix cache; the first
requests after it compute again the system prompt and history that warm requests read from the
cache. Comparing them with the earlier start's first requests (just as cold) cannot show it; the
state before the switch can. Per model (and the block size and hash algorithm its hashes depend
on) this keeps, without prompt text: the warm requests' cached share, and a bounded table of
vLLM's own block hashes (their first 8 bytes) of the blocks those requests found cached, with how
often. vLLM chains its block hashes (each fingerprints the whole prefix up to its block), so a
new request's deepest block whose hash is in the table says how much of its prompt had been
cached before the switch.

Stored in one small JSON file beside the verdict's history (``prefixes.json`` next to
``activations.json``), read with it, written under the same advisory lock, whole, by temporary
file and rename; bounded (``MAX_BLOCKS`` per model, ``MAX_MODELS``, ``MAX_BYTES``). A file that is
not ours is never overwritten.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from otel_ttft.runtime import activation_history as history

FORMAT = "otel-ttft-prefix-baseline"
VERSION = 1
FILE_NAME = "prefixes.json"
MAX_BYTES = 1 << 20
MAX_BLOCKS = 2048  # block hashes kept per model: the most often found cached
MAX_MODELS = 16
SAVE_EVERY_S = 30.0  # the table is written at most this often (and at exit)
#: vLLM's hash algorithms whose seed is random per process unless PYTHONHASHSEED is set
PER_PROCESS_SEED = ("xxhash", "xxhash_cbor")


def path_beside(history_path: Path) -> Path:
    """The prefix baseline's file, in the directory of the verdict's history."""
    return history_path.with_name(FILE_NAME)


@dataclass
class Table:
    """One model's baseline: block hash (hex of its first 8 bytes) -> times found cached, and
    the warm requests' prompt and cached tokens."""

    model: str | None = None
    hash_tokens: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    blocks: dict[str, int] = field(default_factory=dict)
    at: float = 0.0

    def as_json(self) -> dict:
        kept = sorted(self.blocks.items(), key=lambda kv: -kv[1])[:MAX_BLOCKS]
        return {"model": self.model, "hash_tokens": self.hash_tokens, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "blocks": dict(kept), "at": round(self.at, 3)}

    @classmethod
    def from_json(cls, data: object) -> Table | None:
        if not isinstance(data, dict) or not isinstance(data.get("blocks"), dict):
            return None
        ints = [data.get(k) for k in ("hash_tokens", "requests", "prompt_tokens",
                                      "cached_tokens")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            return None
        blocks = {k: v for k, v in list(data["blocks"].items())[:MAX_BLOCKS]
                  if isinstance(k, str) and len(k) == 16 and isinstance(v, int) and v > 0}
        at = data.get("at")
        model = data.get("model")
        return cls(model if isinstance(model, str) else None, *ints, blocks,
                   float(at) if isinstance(at, (int, float)) else 0.0)

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True)
class Seen:
    """A request's prompt against the baseline: tokens of its prefix the warm requests before
    the switch had found cached, and which prefix (its deepest known block)."""

    tokens: int
    prefix: str | None


class PrefixMemory:
    """The API server's baseline for its model: the table read at start (``before``: what
    was cached before this start) and the one this process adds to and saves."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.path: Path | None = None
        self.problem: str | None = None  # why there is no baseline (read, or not comparable)
        self.before: Table | None = None
        self._before_blocks: frozenset[str] = frozenset()
        self.table = Table()
        self._lock = threading.Lock()
        self._dirty = False
        self._saved_at = time.monotonic()
        self._saving: threading.Thread | None = None

    def configure(self, key: str, model: str | None, hash_algo: str | None,
                  hash_seed_set: bool) -> None:
        """Which table this server keeps; off where vLLM's block hashes change per process."""
        self.key = key
        self.table.model = model
        if hash_algo in PER_PROCESS_SEED and not hash_seed_set:
            self.problem = (f"vLLM's {hash_algo} block hashes are seeded per process "
                            "(PYTHONHASHSEED unset): prefixes cannot be recognised after a "
                            "restart")

    def load(self, path: Path | None) -> None:
        """Read the baseline (the verdict's history thread); never raises."""
        self.path = path
        if path is None or self.key is None or self.problem:
            return
        data, problem, _ours = history.read_document(path, FORMAT, VERSION, MAX_BYTES)
        if data is None:
            self.problem = problem
            return
        models = data.get("models")
        table = Table.from_json(models.get(self.key)) if isinstance(models, dict) else None
        if table is None:
            return
        with self._lock:
            self.before = table
            self._before_blocks = frozenset(table.blocks)
            model = self.table.model
            self.table = Table(model, table.hash_tokens, table.requests, table.prompt_tokens,
                               table.cached_tokens, dict(table.blocks), table.at)

    def rebase(self) -> None:
        """A wake-up in this process: what its warm requests found before it slept is the
        baseline now."""
        with self._lock:
            t = self.table
            self.before = Table(t.model, t.hash_tokens, t.requests, t.prompt_tokens,
                                t.cached_tokens, dict(t.blocks), t.at)
            self._before_blocks = frozenset(t.blocks)

    def seen(self, hashes: list[bytes], tokens_per_hash: int, prompt_tokens: int) -> Seen:
        """How much of a prompt was cached before this start (its deepest block in ``before``);
        ``Seen(0, None)`` without a baseline."""
        known = self._before_blocks
        if not known or tokens_per_hash <= 0:
            return Seen(0, None)
        for i in range(min(len(hashes), prompt_tokens // tokens_per_hash) - 1, -1, -1):
            digest = hashes[i].hex()
            if digest in known:
                return Seen((i + 1) * tokens_per_hash, digest)
        return Seen(0, None)

    def found_cached(self, hashes: list[bytes], tokens_per_hash: int, prompt_tokens: int,
                     cached_tokens: int) -> None:
        """A request read ``cached_tokens`` of its prompt from the cache: count its cached
        blocks and its share. Called after the fact (the request's emission), for the requests
        EngineCore shipped hashes for."""
        if self.key is None or self.problem or tokens_per_hash <= 0:
            return
        blocks = [h.hex() for h in hashes[:min(cached_tokens, prompt_tokens) // tokens_per_hash]]
        with self._lock:
            t = self.table
            t.hash_tokens = tokens_per_hash
            t.requests += 1
            t.prompt_tokens += prompt_tokens
            t.cached_tokens += min(cached_tokens, prompt_tokens)
            for digest in blocks:
                t.blocks[digest] = t.blocks.get(digest, 0) + 1
            if len(t.blocks) > 2 * MAX_BLOCKS:  # amortized: trim to the most often found
                t.blocks = dict(sorted(t.blocks.items(), key=lambda kv: -kv[1])[:MAX_BLOCKS])
            t.at = time.time()
            self._dirty = True
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save_soon()

    def save_soon(self) -> None:
        """Write the table in a thread (one at a time), if anything changed."""
        if not self._dirty or self.path is None or (
                self._saving is not None and self._saving.is_alive()):
            return
        self._saved_at = time.monotonic()
        self._saving = threading.Thread(target=self.save, name="otel-ttft-prefix-save",
                                        daemon=True)
        self._saving.start()

    def save(self) -> str | None:
        """Write this model's table into the file (others' kept), under the history's lock;
        ``None`` or why not (then the next save tries again)."""
        problem = self._save()
        if problem is not None:
            self._dirty = True
        return problem

    def _save(self) -> str | None:
        path, key = self.path, self.key
        if path is None or key is None or not self._dirty:
            return None
        with self._lock:
            entry = self.table.as_json()
            self._dirty = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create {path.parent}: {exc.strerror or exc}"
        import json

        with history.locked(path.with_name(path.name + ".lock")) as problem:
            if problem:
                return problem
            data, problem, ours = history.read_document(path, FORMAT, VERSION, MAX_BYTES)
            if not ours:
                return problem or f"{path} is not ours"
            models = dict((data or {}).get("models") or {})
            models.pop(key, None)
            # this model first, then the others newest first; on a tie (the same millisecond)
            # the file's own order, which this write keeps newest first
            others = sorted(enumerate(models.items()), key=lambda ikv: (
                -(ikv[1][1].get("at") or 0) if isinstance(ikv[1][1], dict) else 0, ikv[0]))
            newest = [(key, entry), *(kv for _, kv in others)][:MAX_MODELS]
            while True:
                text = json.dumps({"format": FORMAT, "version": VERSION,
                                   "models": dict(newest)}, separators=(",", ":"))
                if len(text) <= MAX_BYTES or len(newest) <= 1:
                    break
                newest = newest[:-1]
            return history.write_text(path, text)
