"""What vLLM's compile cache held: which keys have artifacts, for which configuration where vLLM
wrote it down, and whether the directory survives a restart.

A compile-cache miss has three usual causes, and each has its own fix: the cache was empty
(deleted, or the first start on this host), it held artifacts for another key (another vLLM or
torch version, another configuration: vLLM hashes them into the directory name), or it lives where
a restart loses it (a container's own file system, a ``tmpfs``). :func:`inspect` reads enough of
``$VLLM_CACHE_ROOT/torch_compile_cache`` to tell them apart, cheaply and bounded: directory
listings (at most ``max_entries`` keys, ``max_files`` names per key), file sizes and times, and
the small ``cache_key_factors.json`` vLLM writes beside its non-AOT artifacts; never an
artifact's content. Taken before the start compiles (the live verdict does it when the engine
config is known), it says what the compile found; :meth:`CompileCacheState.entry_for` finds the
key a start used (its ``ttft.compile.cache_dir``).

vLLM's two layouts (0.32): ``torch_compile_cache/<10 hex>/rank_R_D/<prefix>/`` with
``cache_key_factors.json`` (Inductor's standalone compile), and
``torch_compile_cache/torch_aot_compile/<64 hex>/rank_R_D/model`` (``VLLM_USE_AOT_COMPILE``) with
``inductor_cache/`` beside it. Standard library and ``history_storage`` only: the runtime takes
it as it is, ``doctor`` and the diagnosis read its dataclass.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from otel_ttft.runtime import history_storage

COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
FACTORS_FILE = "cache_key_factors.json"
MAX_ENTRIES = 64  # keys listed; a cache with more is reported as truncated
MAX_FILES = 256  # names counted per key (rank directories and what is in them)
MAX_FACTORS_BYTES = 64 * 1024
_FACTOR_KEYS = ("config_hash", "code_hash", "compiler_hash")

STATE_MISSING = "missing"  # no compile-cache directory at all
STATE_EMPTY = "empty"  # the directory, no artifacts under any key
STATE_OTHER_KEYS = "other-keys"  # artifacts, but not under the key this start used
STATE_PRESENT = "present"  # artifacts under the key this start used
STATE_UNKNOWN = "unknown"  # artifacts somewhere; which key this start used is not known


@dataclass(frozen=True)
class CacheEntry:
    """One cache key (a directory vLLM named by hashing what the compile depends on)."""

    path: str
    key: str
    aot: bool
    artifact_files: int  # files found (bounded by ``MAX_FILES``)
    artifact_bytes: int
    newest_mtime: float | None  # of the files counted; None without any
    factors: dict[str, str] = field(default_factory=dict)  # vLLM's hashes, where it wrote them
    truncated: bool = False  # more names than counted


@dataclass(frozen=True)
class CompileCacheState:
    """The compile cache under one ``VLLM_CACHE_ROOT`` as :func:`inspect` found it."""

    cache_root: str
    exists: bool
    entries: tuple[CacheEntry, ...] = ()
    truncated: bool = False  # more keys than ``MAX_ENTRIES``
    disabled: bool = False  # ``VLLM_DISABLE_COMPILE_CACHE`` set
    kept: bool | None = None  # survives a restart (``history_storage.assess``); None: unknown
    kept_why: str = ""
    in_container: bool = False
    problem: str | None = None  # why the directory could not be read

    @property
    def with_artifacts(self) -> tuple[CacheEntry, ...]:
        return tuple(e for e in self.entries if e.artifact_files)

    def entry_for(self, used_dir: str | os.PathLike[str] | None) -> CacheEntry | None:
        """The entry of the key a start used: ``used_dir`` is its ``ttft.compile.cache_dir``
        (the key's directory or one below it)."""
        if not used_dir:
            return None
        used = os.path.normpath(str(used_dir))
        for entry in self.entries:
            if used == entry.path or used.startswith(entry.path.rstrip("/") + "/"):
                return entry
        return None

    def state_for(self, used_dir: str | os.PathLike[str] | None) -> str:
        """``missing``, ``empty``, ``other-keys``, ``present`` or ``unknown`` for the key a start
        used (as this snapshot, taken before the start compiled, saw it)."""
        if not self.exists:
            return STATE_MISSING
        found = self.with_artifacts
        if not found:
            return STATE_EMPTY
        if not used_dir:
            return STATE_UNKNOWN
        entry = self.entry_for(used_dir)
        return STATE_PRESENT if entry is not None and entry.artifact_files else STATE_OTHER_KEYS

    def summary(self, used_dir: str | os.PathLike[str] | None = None) -> dict:
        """JSON-ready: what the verdict's evidence keeps (no paths beyond the root and keys)."""
        others = [e for e in self.with_artifacts if e is not self.entry_for(used_dir)]
        newest = max((e.newest_mtime for e in others if e.newest_mtime), default=None)
        return {"root": self.cache_root, "state": self.state_for(used_dir),
                "keys_with_artifacts": len(self.with_artifacts),
                "other_keys": [e.key for e in others][:8],
                "other_newest_mtime": round(newest, 3) if newest else None,
                "other_factors": next((e.factors for e in others if e.factors), {}),
                "disabled": self.disabled, "kept": self.kept, "kept_why": self.kept_why,
                "in_container": self.in_container, "truncated": self.truncated}


def _scan_files(top: str, limit: int) -> tuple[int, int, float | None, bool]:
    """Files, bytes and the newest mtime under ``top``, at most ``limit`` names looked at
    (directories walked breadth first, symlinks not followed)."""
    files = size = seen = 0
    newest: float | None = None
    pending = [top]
    while pending:
        here = pending.pop(0)
        try:
            with os.scandir(here) as it:
                for item in it:
                    seen += 1
                    if seen > limit:
                        return files, size, newest, True
                    try:
                        st = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(item.path)
                    elif stat.S_ISREG(st.st_mode) and item.name != FACTORS_FILE \
                            and not item.name.endswith(".lock"):
                        files += 1
                        size += st.st_size
                        newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
        except OSError:
            continue
    return files, size, newest, False


def _factors(key_dir: str) -> dict[str, str]:
    """vLLM's own hashes of a non-AOT key (``rank_*/<prefix>/cache_key_factors.json``), the
    first found; small files only."""
    try:
        ranks = sorted(e.path for e in os.scandir(key_dir) if e.name.startswith("rank_")
                       and e.is_dir(follow_symlinks=False))[:4]
        for rank in ranks:
            for sub in sorted(os.scandir(rank), key=lambda e: e.name)[:8]:
                path = os.path.join(sub.path, FACTORS_FILE)
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FACTORS_BYTES:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    data = json.loads(f.read(MAX_FACTORS_BYTES))
                if isinstance(data, dict):
                    return {k: str(data[k])[:80] for k in _FACTOR_KEYS if k in data}
    except (OSError, ValueError, RecursionError):
        pass
    return {}


def _keys(parent: str, aot: bool, limit: int) -> tuple[list[str], bool]:
    try:
        with os.scandir(parent) as it:
            names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False)
                           and (aot or e.name != AOT_DIR))
    except OSError:
        return [], False
    return names[:limit], len(names) > limit


def inspect(cache_root: str | os.PathLike[str], *, max_entries: int = MAX_ENTRIES,
            max_files: int = MAX_FILES, environ: dict[str, str] | None = None,
            mounts: list[history_storage.Mount] | None = None,
            hints: list[str] | None = None) -> CompileCacheState:
    """The compile cache under ``cache_root`` (vLLM's ``VLLM_CACHE_ROOT``). Never raises:
    an unreadable directory is ``problem``. ``mounts``/``hints``: this process's mounts and
    container hints unless given (tests)."""
    environ = os.environ if environ is None else environ
    root = str(Path(cache_root).expanduser())
    top = os.path.join(root, COMPILE_DIR)
    disabled = environ.get("VLLM_DISABLE_COMPILE_CACHE", "").strip().lower() in ("1", "true")
    try:
        if mounts is None or hints is None:
            mounts, hints = history_storage.here()
        where = history_storage.assess(history_storage.resolved(top), mounts, hints)
        kept, why, in_container = where["kept"], where["why"], where["in_container"]
    except Exception:  # noqa: BLE001 - an assessment, never an error
        kept, why, in_container = None, "mounts not read", False
    base = {"cache_root": root, "disabled": disabled, "kept": kept, "kept_why": why,
            "in_container": in_container}
    try:
        st = os.stat(top)
    except FileNotFoundError:
        return CompileCacheState(exists=False, **base)
    except OSError as exc:
        return CompileCacheState(exists=False, problem=f"cannot read {top}: {exc.strerror}",
                                 **base)
    if not stat.S_ISDIR(st.st_mode):
        return CompileCacheState(exists=False, problem=f"{top} is not a directory", **base)
    entries: list[CacheEntry] = []
    truncated = False
    for parent, aot in ((top, False), (os.path.join(top, AOT_DIR), True)):
        names, more = _keys(parent, aot, max_entries - len(entries))
        truncated = truncated or more
        for name in names:
            path = os.path.join(parent, name)
            files, size, newest, cut = _scan_files(path, max_files)
            entries.append(CacheEntry(path=path, key=name, aot=aot, artifact_files=files,
                                      artifact_bytes=size, newest_mtime=newest,
                                      factors={} if aot else _factors(path), truncated=cut))
    return CompileCacheState(exists=True, entries=tuple(entries), truncated=truncated, **base)
