"""The store's files, schema and connections: what both the writer (``store``) and the readers
(``store_read``) need, in a leaf so neither imports the other back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from otel_ttft.tools import safe_io

DB_FILE = "telemetry.db"
# Earlier versions' JSON-lines files, still read (and cleared by ``clear``).
SPANS_FILE = "spans.jsonl"
METRICS_FILE = "metrics.jsonl"
STORE_FILES = (DB_FILE, DB_FILE + "-wal", DB_FILE + "-shm", SPANS_FILE, METRICS_FILE)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (id INTEGER PRIMARY KEY, data TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS spans (
    id INTEGER PRIMARY KEY, trace_id TEXT NOT NULL, span_id TEXT NOT NULL,
    parent_span_id TEXT, name TEXT NOT NULL, stage TEXT, start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL, resource_id INTEGER REFERENCES resources(id), data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS spans_by_trace ON spans(trace_id);
CREATE INDEX IF NOT EXISTS spans_by_name ON spans(name, start_ns);
CREATE INDEX IF NOT EXISTS spans_by_stage ON spans(stage, start_ns);
CREATE INDEX IF NOT EXISTS spans_by_start ON spans(start_ns);
CREATE TABLE IF NOT EXISTS metric_points (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, time_ns INTEGER,
    resource_id INTEGER REFERENCES resources(id), data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS metric_points_by_name ON metric_points(name, time_ns);
"""


class StoreFormatError(ValueError):
    """A stored record is unreadable (corruption or a foreign file, not a crash)."""

    def __init__(self, path: Path, lineno: int | None, reason: str) -> None:
        super().__init__(f"{path}:{lineno}: {reason}" if lineno else f"{path}: {reason}")
        self.path, self.lineno, self.reason = path, lineno, reason


class StoreUnavailable(OSError):
    """The store could not commit a batch (disk full, file-size limit, I/O error); nothing of
    the batch is stored, and the sender should retry later."""



# --- connections -------------------------------------------------------------------------------
def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in WAL mode (creating the schema unless ``readonly``)."""
    if readonly:
        try:  # SQLite would open a FIFO and block: the input rule first
            if safe_io.input_kind(path) != "file":
                raise sqlite3.OperationalError("a directory, not a database file")
        except safe_io.InputError as exc:
            raise sqlite3.OperationalError(exc.reason) from None
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False, timeout=30)
        conn.execute("PRAGMA query_only=1")
        conn.execute("PRAGMA cache_size=-16384")
        return conn
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # a commit is on disk before it is acknowledged
    conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: index pages stay hot (a third less CPU)
    conn.executescript(_SCHEMA)
    return conn


SQLITE_MAGIC = b"SQLite format 3\x00"


def is_store_db(path: Path) -> bool:
    """A regular file that starts like a SQLite database (looked at without blocking: a FIFO
    is not one)."""
    try:
        return safe_io.read_header(path, len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except safe_io.InputError:
        return False
