"""Cold means cold: drop a checkpoint from the page cache, check right before the server starts
that it left, and say why when it did not.

``POSIX_FADV_DONTNEED`` is advice. The kernel keeps pages that are dirty (a checkpoint written or
downloaded in the last half minute: they must be written back first, so we write them back),
pages that a process has mapped, and anything another reader pulls back in between (on this
host's disk one header read through mmap brings the whole shard back: the fault reads around
it, up to ``read_ahead_kb``, 8 MB here). So the replay evicts, measures, evicts once more if the
checkpoint is still there, and records what it measured; a checkpoint that stays resident makes
the step "not cold", with the processes that map it when any do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from otel_ttft import semconv
from otel_ttft.runtime.hooks.load import pagecache

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npy")
MAX_FILES = 10_000  # a checkpoint directory, not a file system
MAX_PROCESSES = 4096  # /proc entries looked at for mappings


@dataclass
class ColdCheck:
    """What the replay measured of one cold step's checkpoint right before the switch."""

    resident: float | None = None  # byte-weighted share in the page cache; None: not measurable
    attempts: int = 0  # evictions made
    held_by: list[str] = field(default_factory=list)  # "pid name" of processes mapping it

    @property
    def cold(self) -> bool | None:
        return None if self.resident is None else self.resident <= semconv.COLD_RESIDENT_MAX

    def attributes(self) -> dict:
        attrs: dict = {semconv.ATTR_REPLAY_EVICT_ATTEMPTS: self.attempts}
        if self.resident is not None:
            attrs[semconv.ATTR_REPLAY_EVICT_RESIDENT] = round(self.resident, 4)
            attrs[semconv.ATTR_REPLAY_EVICT_COLD] = bool(self.cold)
        if self.held_by:
            attrs[semconv.ATTR_REPLAY_EVICT_HELD_BY] = self.held_by[:20]
        return attrs


def _files(model_dir: str | os.PathLike) -> list[Path]:
    try:
        return sorted(p for p in Path(model_dir).rglob("*") if p.is_file())[:MAX_FILES]
    except OSError:
        return []


def checkpoint_files(model_dir: str | os.PathLike) -> list[Path]:
    """The weight files of a model directory (every regular file when none looks like one)."""
    files = _files(model_dir)
    return [p for p in files if p.suffix in WEIGHT_SUFFIXES] or files


def evict(model_dir: str | os.PathLike) -> None:
    """Write back, then drop every file of the model directory (config and tokenizer too: a
    cold start reads them as well) from the page cache."""
    for path in _files(model_dir):
        pagecache.evict(path)


def resident(model_dir: str | os.PathLike) -> float | None:
    """Byte-weighted share of the checkpoint's weight files in the page cache now."""
    total, cached = 0, 0.0
    for path in checkpoint_files(model_dir):
        ratio = pagecache.resident_ratio(path)
        if ratio is None:
            return None
        size = max(path.stat().st_size, 1)
        total += size
        cached += ratio * size
    return cached / total if total else None


def mapped_by(model_dir: str | os.PathLike) -> list[str]:
    """Processes that have a file of the checkpoint mapped (their ``/proc/PID/maps``)."""
    wanted = {os.path.realpath(p) for p in checkpoint_files(model_dir)}
    found = []
    try:
        pids = [e for e in os.listdir("/proc") if e.isdigit()][:MAX_PROCESSES]
    except OSError:
        return []
    for pid in pids:
        try:
            if not wanted & _mapped_paths(pid):
                continue
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                found.append(f"{pid} {f.read().strip()}")
        except OSError:
            continue
    return found


def _mapped_paths(pid: str) -> set[str]:
    paths = set()
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        for line in f:  # address perms offset dev inode path (the path may hold spaces)
            parts = line.rstrip("\n").split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5])
    return paths


def make_cold(model_dir: str | os.PathLike, check: ColdCheck) -> ColdCheck:
    """Right before the server starts: measure; if the checkpoint is still resident, evict once
    more and measure again; when it stays, find who maps it."""
    check.resident = resident(model_dir)
    if check.cold is False:
        evict(model_dir)
        check.attempts += 1
        check.resident = resident(model_dir)
        if check.cold is False:
            check.held_by = mapped_by(model_dir)
    return check


def private_copy(model_dir: str | os.PathLike, parent: str | os.PathLike) -> Path:
    """A copy of ``model_dir`` under ``parent`` (same directory name, so the same served name)
    that no other process on this host reads: the tiny test models live in one cache every
    test and demo here shares, and any of them starting the same model between our eviction and
    our server's read makes a "cold" read warm. Reused while its files match."""
    src, dest = Path(model_dir), Path(parent) / Path(model_dir).name
    if _same_files(src, dest):
        return dest
    Path(parent).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}-", dir=parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _same_files(src: Path, dest: Path) -> bool:
    def listing(root: Path) -> list[tuple[str, int]]:
        return [(str(p.relative_to(root)), p.stat().st_size) for p in _files(root)]
    try:
        return dest.is_dir() and listing(src) == listing(dest)
    except OSError:
        return False
