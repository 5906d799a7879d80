"""Small JSON files the processes of one vLLM server leave for each other on the same host.

The in-flight tracker publishes each process's open activation spans and the stage an activation
failed in (``telemetry.inflight``); the API process offers a trace context to its EngineCore for
calls that carry none (``handoff``). They live in ``/dev/shm`` (memory: no disk write on the
start-up path), else in the temporary directory. A leaf: it imports nothing of ours.
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
