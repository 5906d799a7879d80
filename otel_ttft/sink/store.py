"""Append-only local store for received telemetry: ``spans.jsonl`` and ``metrics.jsonl``.

One normalized JSON object per line, written and flushed per received batch, so a crash of the
receiver (or of the machine running a long cold-start experiment) loses at most the batch in
flight. Reading skips a truncated last line; before appending, a truncated tail left by an
earlier crash is cut off so every complete line stays parseable.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

SPANS_FILE = "spans.jsonl"
METRICS_FILE = "metrics.jsonl"


class StoreFormatError(ValueError):
    """A complete line of a store file is not a JSON object (corruption, not a crash)."""

    def __init__(self, path: Path, lineno: int, reason: str) -> None:
        super().__init__(f"{path}:{lineno}: {reason}")
        self.path, self.lineno, self.reason = path, lineno, reason


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, object)``; a last line without a newline that does not parse is the
    remainder of an interrupted write and is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        is_tail = index == len(lines) - 1  # no newline after it
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            if is_tail:
                return
            raise StoreFormatError(path, index + 1, f"not JSON ({exc})") from None
        if not isinstance(obj, dict):
            if is_tail:
                return
            raise StoreFormatError(path, index + 1, "not a JSON object")
        yield index + 1, obj


def _cut_truncated_tail(path: Path) -> None:
    """Drop bytes after the last newline (an interrupted write), so appends start a fresh line."""
    try:
        with open(path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            # Scan back in chunks for the last newline.
            pos, keep = size, 0
            while pos > 0:
                step = min(65536, pos)
                pos -= step
                f.seek(pos)
                chunk = f.read(step)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = pos + nl + 1
                    break
            f.truncate(keep)
    except FileNotFoundError:
        return


class SpanStore:
    """Spans and metric data points as JSON lines under one directory; safe across threads."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._repaired: set[Path] = set()

    @property
    def spans_path(self) -> Path:
        return self.directory / SPANS_FILE

    @property
    def metrics_path(self) -> Path:
        return self.directory / METRICS_FILE

    def add_spans(self, spans: Iterable[dict]) -> int:
        """Append one batch of normalized spans; returns how many were written."""
        return self._append(self.spans_path, spans)

    def add_metric_points(self, points: Iterable[dict]) -> int:
        """Append one batch of normalized metric data points; returns how many were written."""
        return self._append(self.metrics_path, points)

    def spans(self) -> list[dict]:
        return [obj for _, obj in iter_jsonl(self.spans_path)]

    def metric_points(self) -> list[dict]:
        return [obj for _, obj in iter_jsonl(self.metrics_path)]

    def _append(self, path: Path, records: Iterable[dict]) -> int:
        lines = [json.dumps(r, separators=(",", ":"), default=_json_default) for r in records]
        if not lines:
            return 0
        payload = ("\n".join(lines) + "\n").encode()
        with self._lock:
            if path not in self._repaired:
                _cut_truncated_tail(path)
                self._repaired.add(path)
            # One write per batch: a crash can only truncate the tail, never interleave lines.
            with open(path, "ab") as f:
                f.write(payload)
                f.flush()
        return len(lines)

    def __repr__(self) -> str:
        return f"SpanStore({str(self.directory)!r})"


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
