"""`tree`, `analyze` and `export` as a careless or hostile user runs them, on copies of a real
store (``hostile_store``: the SDK's exporters into the embedded receiver): every bad input is
exit 2 with one line naming the file and the row, no traceback, no hang, nothing left behind and
no existing file changed; and `export` is valid OTLP/JSON that round-trips.

Each command runs as a separate process with a timeout (``hostile_store.cli``): a hang fails.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import MAX_SPAN_FILE_BYTES
from otel_ttft.tools.sink.db import DB_FILE
from tests.hostile_store import assert_refused, cli, snapshot, sql, unchanged

COMMANDS = ("tree", "analyze", "export")


def run(command: str, source: Path | str, tmp_path: Path, *extra: str):
    """The command on ``source``; analyze and export write into ``tmp_path/out``."""
    out = tmp_path / ("out.json" if command == "analyze" else "out.otlp.json")
    args = {"tree": [], "analyze": ["--json", str(out)], "export": ["-o", str(out)]}[command]
    return cli(command, str(source), *args, *extra)


# --- damaged stores ---------------------------------------------------------------------------
DAMAGE = {
    "trace id as BLOB": ("UPDATE spans SET trace_id = ? WHERE id = 3", (bytes(range(16)),),
                         "trace_id is a BLOB"),
    "parent id as BLOB": ("UPDATE spans SET parent_span_id = ? WHERE id = 4", (bytes(8),),
                          "parent_span_id is a BLOB"),
    "name as BLOB": ("UPDATE spans SET name = X'00ff' WHERE id = 2", (), "name is a BLOB"),
    "start as text": ("UPDATE spans SET start_ns = 'soon' WHERE id = 5", (), "start_ns is text"),
    "start as float": ("UPDATE spans SET start_ns = 1.5 WHERE id = 5", (), "start_ns is a float"),
    "end negative": ("UPDATE spans SET end_ns = -5 WHERE id = 6", (), "end_ns -5 is out of range"),
    "data not JSON": ("UPDATE spans SET data = '{broken' WHERE id = 7", (), "data is not JSON"),
    "data a list": ("UPDATE spans SET data = '[1, 2]' WHERE id = 7", (), "not a JSON object"),
    "data as BLOB": ("UPDATE spans SET data = ? WHERE id = 7", (b"\xff\xfe",), "not JSON"),
    "attributes a list": ("UPDATE spans SET data = '{\"attributes\": [\"ttft.stage\"]}' "
                          "WHERE id = 8", (), "'attributes' is a list"),
    "events an object": ("UPDATE spans SET data = '{\"events\": {}}' WHERE id = 8", (),
                         "'events' is an object, not a list"),
    "data overrides a column": ("UPDATE spans SET data = '{\"trace_id\": 5}' WHERE id = 8", (),
                                "which is a column"),
    "resource JSON damaged": ("UPDATE resources SET data = '{\"service.name\": '", (),
                              "resource 1: data is not JSON"),
    "resource a string": ("UPDATE resources SET data = '\"svc\"'", (), "not a JSON object"),
    "deep data": ("UPDATE spans SET data = ? WHERE id = 9",
                  ('{"attributes": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",), None),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_store_row_is_one_line_naming_the_row(store_copy: Path, tmp_path: Path,
                                                      command: str, damage: str) -> None:
    statement, params, needle = DAMAGE[damage]
    sql(store_copy, statement, params)
    before = snapshot(tmp_path)
    proc = run(command, store_copy, tmp_path)
    row = "resource" if damage.startswith("resource") else "row"
    assert_refused(proc, f"otel-ttft {command}: ", str(store_copy / DB_FILE), row,
                   *([needle] if needle else []))
    assert unchanged(before, tmp_path)  # no output file, the store as it was


@pytest.mark.parametrize("command", COMMANDS)
def test_truncated_and_foreign_stores(store_copy: Path, tmp_path: Path, command: str) -> None:
    db = store_copy / DB_FILE
    for path in store_copy.iterdir():
        if path.name != DB_FILE:
            path.unlink()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])  # a copy cut short
    assert_refused(run(command, store_copy, tmp_path), str(db), "not a readable store")
    db.write_bytes(b"SQLite format 3\x00" + b"\x07" * 5000)  # the magic, then garbage
    assert_refused(run(command, store_copy, tmp_path), str(db), "not a readable store")
    db.write_text("just text\n")  # not a database: the directory is no store
    assert_refused(run(command, store_copy, tmp_path), str(db), "not a readable store")
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.otlp.json").exists()


# --- inputs that are not regular files ---------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_fifo_device_socket_never_hang(tmp_path: Path, store_copy: Path, command: str) -> None:
    fifo = tmp_path / "spans.json"
    os.mkfifo(fifo)  # nobody writes: a blocking open would wait forever (the timeout guards)
    assert_refused(run(command, fifo, tmp_path), str(fifo), "named pipe (FIFO)")
    assert_refused(run(command, "/dev/zero", tmp_path), "/dev/zero", "character device")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        assert_refused(run(command, tmp_path / "sock", tmp_path), "a socket")
    finally:
        sock.close()
    (store_copy / DB_FILE).unlink()
    os.mkfifo(store_copy / DB_FILE)  # a store whose database is a FIFO
    assert_refused(run(command, store_copy, tmp_path), str(store_copy / DB_FILE),
                   "named pipe (FIFO)")
    assert_refused(run(command, tmp_path / "missing", tmp_path), "no such file or directory")
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.otlp.json").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_span_file_over_the_cap(tmp_path: Path, command: str) -> None:
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(MAX_SPAN_FILE_BYTES + 1)  # sparse: no disk, and never read
    assert_refused(run(command, huge, tmp_path), str(huge), "larger than the 1 GiB cap")


DEEP = {
    "otlp nested 100k": '{"resourceSpans": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
    "array nested 100k": "[" * 100_000 + "]" * 100_000 + "\n",
    "otlp over the receiver's depth": json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s", "attributes": [{
            "key": "k", "value": json.loads('{"arrayValue": {"values": [' * 30 + "{}"
                                            + "]}}" * 30)}]}]}]}]}) + "\n",
    "not UTF-8": "\udcff\udcfe{}\n",
    "second line damaged": '{"trace_id": "' + "ab" * 16 + '", "span_id": "' + "cd" * 8
                           + '", "name": "s", "start_ns": 1, "end_ns": 2}\n{nope\n{}\n',
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(DEEP))
def test_json_files_deep_or_damaged(tmp_path: Path, command: str, case: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(DEEP[case], errors="surrogateescape")
    needle = {"otlp nested 100k": "nested too deeply", "array nested 100k": "nested too deeply",
              "otlp over the receiver's depth": "deeper than 64", "not UTF-8": "not UTF-8",
              "second line damaged": "in.json:2"}[case]
    assert_refused(run(command, path, tmp_path), str(path), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json"]


@pytest.mark.parametrize("column, value, needle", [
    ("span_id", "7", "span_id '7' is not 16 hex digits"),  # TEXT affinity: 7 is stored as '7'
    ("trace_id", "zz" * 16, "is not 32 hex digits"),
    ("trace_id", "0" * 32, "trace_id is all zero"),
    ("parent_span_id", "abc", "parent_span_id 'abc' is not 16 hex digits"),
    ("data", '{"attributes": {"n": 18446744073709551616}}', "out of int64 range"),
    ("data", '{"kind": "SIDEWAYS"}', "is not an OTLP kind"),
    ("data", '{"events": [{"name": "e", "time_ns": -1}]}', "event time_ns -1 is out of range"),
    ("data", '{"links": [{"trace_id": "ab", "span_id": "cd"}]}', "link trace_id 'ab'"),
    ("data", '{"status": {"code": "ERROR", "message": 5}}', "status message is an integer"),
])
def test_export_refuses_what_the_receiver_would(store_copy: Path, tmp_path: Path, column: str,
                                                value: str, needle: str) -> None:
    """Values `tree` and `analyze` can live with, but that are not OTLP: export names the span
    and writes nothing (an existing output is kept)."""
    sql(store_copy, f"UPDATE spans SET {column} = ? WHERE id = 5", (value,))
    out = tmp_path / "out.otlp.json"
    out.write_text("previous export\n")
    assert_refused(cli("export", str(store_copy), "-o", str(out)), "nothing written", needle)
    assert out.read_text() == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.otlp.json", "store"]
    assert cli("tree", str(store_copy)).returncode == 0


def test_odd_links_on_request_spans(store_copy: Path, tmp_path: Path) -> None:
    """Found by fuzzing: a request span's link whose attributes are not an object (or whose
    trace id is not text) is no activation link for `analyze`, and not OTLP for `export`."""
    sql(store_copy, "UPDATE spans SET data = json_set(data, '$.links', json(?)) "
        "WHERE name = 'llm_request'", ('[{"trace_id": 5, "span_id": "x", "attributes": "x"}, '
                                       '{"trace_id": 7, "attributes": {"ttft.link.kind": '
                                       '"activation"}}]',))
    out = tmp_path / "analysis.json"
    proc = cli("analyze", str(store_copy), "--json", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert all(r["activation_trace_id"] is None or isinstance(r["activation_trace_id"], str)
               for r in json.loads(out.read_text())["requests"])
    assert cli("report", str(out), "-o", str(tmp_path / "r.html")).returncode == 0
    assert_refused(cli("export", str(store_copy), "-o", str(tmp_path / "x.json")),
                   "link trace_id is an integer")


@pytest.mark.parametrize("span, attribute, value", [
    ("llm_request", semconv.ATTR_REQUEST_TTFT, 1e300),  # used to overflow the ns arithmetic
    ("replay.request", semconv.ATTR_CLIENT_TTFT, 1e300),
    ("replay.request", semconv.ATTR_CLIENT_TTFT, -1.0),  # used to reach the analysis document
    ("llm_request", semconv.ATTR_REQUEST_TTFT, -0.5),
])
def test_absurd_durations_never_make_an_analysis_report_refuses(
        store_copy: Path, tmp_path: Path, span: str, attribute: str, value: float) -> None:
    """Found by fuzzing: a TTFT attribute out of any plausible range is unknown to analysis; what
    `analyze` writes is always what `report` and `check` accept."""
    sql(store_copy, f"UPDATE spans SET data = json_set(data, '$.attributes.\"{attribute}\"', ?) "
        "WHERE name = ?", (value, span))
    out = tmp_path / "analysis.json"
    proc = cli("analyze", str(store_copy), "--json", str(out))
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        assert cli("report", str(out), "-o", str(tmp_path / "r.html")).returncode == 0
        assert cli("check", str(out), str(out)).returncode == 0
