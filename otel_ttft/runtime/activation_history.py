"""The live verdict's memory: the last few activations of each model and configuration on this
host, in one small JSON file beside vLLM's cache.

Whatever is at the path, a start must neither fail nor wait for it: a missing, unreadable,
truncated, foreign (not ours), oversized or non-regular file (a FIFO, a directory) reads as "no
baseline" with the reason, read without blocking and bounded in size. Writes happen off the
start-up path (the caller's thread), under an advisory lock on a side file waited for a bounded
time (two servers starting at once both keep their record), and replace the file whole (temporary
file + rename). A file that is not ours is never overwritten; one of ours that no longer parses is
started afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from otel_ttft.diagnosis.record import valid_record
from otel_ttft.runtime import environment_variables

FORMAT = "otel-ttft-activation-history"
VERSION = 1
MAX_BYTES = 1 << 20  # a history is a few KiB; more is not ours, or damaged
PER_KEY = 16  # records kept per model and configuration
MAX_RECORDS = 256  # records kept in all
LOCK_WAIT_S = 2.0
_HEAD = 256  # bytes read to tell our file (damaged or too large) from someone else's
_OFF = ("0", "false", "off", "no")


def enabled() -> bool:
    return os.environ.get(environment_variables.OTEL_TTFT_VERDICT, "").strip().lower() not in _OFF


def default_path(cache_root: str | None) -> Path | None:
    """``OTEL_TTFT_VERDICT_HISTORY``, else ``otel-ttft/activations.json`` under ``cache_root``
    (vLLM's ``VLLM_CACHE_ROOT`` as it resolves it); ``None`` when neither is known."""
    explicit = os.environ.get(environment_variables.OTEL_TTFT_VERDICT_HISTORY, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return Path(cache_root).expanduser() / "otel-ttft" / "activations.json" if cache_root else None


@dataclass
class Loaded:
    """What a read found: the valid records (oldest first), why there are none (``None``: the
    file read fine, or is simply missing), and whether it may be replaced."""

    records: list[dict] = field(default_factory=list)
    problem: str | None = None
    ours: bool = True


def read_document(path: Path, fmt: str, version: int, max_bytes: int = MAX_BYTES
                  ) -> tuple[dict | None, str | None, bool]:
    """``(document, problem, ours)``: the JSON object at ``path`` if it is a ``fmt`` file of
    ``version`` (else ``None`` and why; ``None`` and no problem for a missing file). Never
    raises, never blocks on a FIFO or device, reads at most ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, None, True
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror or exc}", False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{path} is not a regular file", False
        with os.fdopen(os.dup(fd), "rb") as f:
            head = f.read(_HEAD)
            ours = fmt.encode() in head
            if st.st_size > max_bytes:
                return None, f"{path} is larger than {max_bytes} bytes", ours
            raw = head + f.read(max_bytes + 1 - len(head))
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}", False
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        return None, f"{path} is larger than {max_bytes} bytes", ours
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, f"{path} is not valid JSON" + ("" if ours else " (not ours)"), ours
    if not isinstance(data, dict) or data.get("format") != fmt:
        return None, f"{path} is not an {fmt} file", False
    if data.get("version") != version:
        return None, f"{path}: unknown version {data.get('version')!r}", True
    return data, None, True


def load(path: Path) -> Loaded:
    """The records at ``path``; never raises, never blocks on a FIFO or device."""
    data, problem, ours = read_document(path, FORMAT, VERSION)
    if data is None:
        if problem and problem.endswith(f"is not an {FORMAT} file"):
            problem = f"{path} is not an otel-ttft activation history"
        return Loaded(problem=problem, ours=ours)
    if not isinstance(data.get("records"), list):
        return Loaded(problem=f"{path}: unknown history version {data.get('version')!r}")
    return Loaded(records=[r for r in data["records"] if valid_record(r)])


def save(path: Path, record: dict) -> str | None:
    """Add ``record`` (replacing one with its ``id``), trim, replace the file whole. Under the
    side lock, waited for ``LOCK_WAIT_S`` at most. ``None``, or why it was not written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {path.parent}: {exc.strerror or exc}"
    with locked(path.with_name(path.name + ".lock")) as problem:
        if problem:
            return problem
        current = load(path)
        if not current.ours:
            return current.problem or f"{path} is not ours"
        records = [r for r in current.records if r.get("id") != record.get("id")] + [record]
        return _write(path, _trim(records))


def _trim(records: list[dict]) -> list[dict]:
    kept: list[dict] = []
    per_key: dict[str, int] = {}
    for r in reversed(records):  # newest first
        n = per_key.get(r["key"], 0)
        if n < PER_KEY:
            per_key[r["key"]] = n + 1
            kept.append(r)
    return list(reversed(kept[:MAX_RECORDS]))


def _write(path: Path, records: list[dict]) -> str | None:
    while True:
        text = json.dumps({"format": FORMAT, "version": VERSION, "records": records},
                          separators=(",", ":"))
        if len(text) <= MAX_BYTES or not records:
            break
        records = records[1:]  # oldest first out
    return write_text(path, text)


def write_text(path: Path, text: str) -> str | None:
    """``text`` replaces ``path`` whole (temporary file, fsync, rename); ``None`` or why not."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return None
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return f"cannot write {path}: {exc.strerror or exc}"


@contextlib.contextmanager
def locked(lock_path: Path):
    """Yields ``None`` with the lock held, or why it could not be taken."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        yield f"cannot open the lock {lock_path}: {exc.strerror or exc}"
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            yield f"the lock {lock_path} is not a regular file"
            return
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    yield f"the lock {lock_path} stayed held for {LOCK_WAIT_S:g} s"
                    return
                time.sleep(0.02)
        try:
            yield None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
