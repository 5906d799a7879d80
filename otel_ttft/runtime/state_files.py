"""Small JSON files the processes of one vLLM server leave for each other on the same host.

The in-flight tracker publishes each process's open activation spans (``open_chain_path``) and
the stage an activation failed in (``record_failure``); the API process offers a trace context to
its EngineCore for calls that carry none (``handoff``). They live in ``/dev/shm`` (memory: no disk
write on the start-up path), else in the temporary directory. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path


def state_dir() -> Path:
    """Where the files go: ``/dev/shm`` where there is one, else the temporary directory."""
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def write_atomic(path: Path, data: object) -> None:
    """``data`` as JSON at ``path``, replaced whole: a reader never sees half a file. The temporary
    name is per process and thread, so concurrent writers never share one. Raises OSError."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path, *, remove: bool = False) -> dict | None:
    """The JSON object at ``path`` (``None``: missing, unreadable or not an object); ``remove``:
    delete it once read (whatever it held)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if remove:
        with contextlib.suppress(OSError):
            path.unlink()
    return data if isinstance(data, dict) else None


def open_chain_path(pid: int) -> Path:
    """Where a process publishes its open activation spans (``inflight``)."""
    return state_dir() / f"otel-ttft-open-{pid}.json"


def read_open_chain(pid: int, *, remove: bool = False) -> dict | None:
    """What a process (alive or dead) last published about its open activation spans."""
    return read_json(open_chain_path(pid), remove=remove)


def _failure_path(trace_id: int) -> Path:
    return state_dir() / f"otel-ttft-failed-{trace_id:032x}.json"


def record_failure(trace_id: int, record: dict) -> None:
    """The stage an activation failed in; the first record of a trace wins (created once)."""
    try:
        fd = os.open(_failure_path(trace_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return  # already recorded (or no state dir)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))


def take_failure(trace_id: int) -> dict | None:
    """The recorded failure of a trace, removed (the root reads it once, when it ends)."""
    return read_json(_failure_path(trace_id), remove=True)


STALE_S = 24 * 3600


def remove_stale() -> None:
    """Open chains and failure records left by process trees killed whole (nobody read them)."""
    import time

    cutoff = time.time() - STALE_S
    with contextlib.suppress(OSError):
        for path in state_dir().glob("otel-ttft-*.json"):
            if path.name.startswith(("otel-ttft-open-", "otel-ttft-failed-")):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
