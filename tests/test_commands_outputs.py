"""The output rule for every command that writes a file (export, analyze --json, report -o,
prometheus --openmetrics): a target that is an input, a directory, a device or a FIFO, or whose
directory is missing, is refused before anything is read; a write that fails (a full disk) leaves
the previous file as it was and no temporary file; `-` is stdout, whole or nothing. And `export`
round-trips: store -> OTLP/JSON -> (the real receiver) -> the same trees and the same analysis.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.request
from pathlib import Path

import pytest

from otel_ttft.tools.sink import otlp_decode
from otel_ttft.tools.sink.db import DB_FILE
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from tests.analysis_fixture import build_analysis
from tests.hostile_store import (
    assert_refused,
    cli,
    file_size_limit,
    full_device,
    snapshot,
    unchanged,
)


def writers(store: Path, analysis: Path, target: str) -> dict[str, list[str]]:
    """Each writing command, its output aimed at ``target``."""
    return {"export": ["export", str(store), "-o", target],
            "analyze": ["analyze", str(store), "--json", target],
            "report": ["report", str(analysis), "-o", target],
            "prometheus": ["prometheus", "--dir", str(store), "--openmetrics", target]}


WRITERS = ("export", "analyze", "report", "prometheus")


@pytest.fixture
def analysis(tmp_path: Path) -> Path:
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(build_analysis(repeat=1)))
    return path


@pytest.mark.parametrize("command", WRITERS)
def test_output_that_is_an_input_is_refused(store_copy: Path, analysis: Path, tmp_path: Path,
                                            command: str) -> None:
    inputs = {"report": [analysis]}.get(command, [store_copy / DB_FILE, store_copy / "spans.jsonl",
                                                  store_copy / (DB_FILE + "-wal")])
    (tmp_path / "alias").symlink_to(inputs[0])
    os.link(inputs[0], tmp_path / "hardlink")
    before = snapshot(tmp_path)
    for target in [*inputs, tmp_path / "alias", tmp_path / "hardlink"]:
        proc = cli(*writers(store_copy, analysis, str(target))[command])
        assert_refused(proc, f"otel-ttft {command}: {target}", "is the input")
    assert unchanged(before, tmp_path)  # in particular the store's database, byte for byte


@pytest.mark.parametrize("command", WRITERS)
def test_directory_device_fifo_missing_parent(store_copy: Path, analysis: Path, tmp_path: Path,
                                              command: str) -> None:
    device = full_device(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody reads it: writing would block forever
    cases = {str(tmp_path): "is a directory", str(device): "a character device",
             str(fifo): "a named pipe (FIFO)", "/dev/stdout": "not a regular file",
             str(tmp_path / "no" / "such" / "out"): "the directory",
             str(analysis / "out"): "is not a directory", "": "empty"}
    for target, needle in cases.items():
        if target == "/dev/stdout":  # a pipe under pytest: refused, `-` is how to say stdout
            needle = "not a regular file; give a file name (or - for stdout)"
        assert_refused(cli(*writers(store_copy, analysis, target)[command]), needle)
    assert stat.S_ISCHR(device.stat().st_mode) and stat.S_ISFIFO(fifo.stat().st_mode)
    assert not (tmp_path / "no").exists()  # a missing directory is refused, never created


def _enlarge_metrics(store: Path, copies: int) -> None:
    """The store's metric points again at later times: an OpenMetrics history over 40 KB."""
    spans = SpanStore(store)
    points = spans.metric_points()
    spans.add_metric_points([{**p, "time_ns": p["time_ns"] + i * 10**9}
                             for i in range(1, copies) for p in points])
    spans.close()


@pytest.mark.parametrize("command", WRITERS)
def test_full_disk_keeps_the_previous_file(store_copy: Path, analysis: Path, tmp_path: Path,
                                           command: str) -> None:
    """Writes past a file-size limit fail with EFBIG, as on a full disk. SQLite's reader writes
    up to 32 KiB into the store's -shm file, so a store is read under a 40 KB limit and with an
    output larger than that; the span commands read the store's OTLP export (no SQLite)."""
    source, limit = store_copy, 40_000
    if command == "prometheus":
        _enlarge_metrics(store_copy, 10)
    elif command != "report":
        source, limit = tmp_path / "spans.otlp.json", 4096
        assert cli("export", str(store_copy), "-o", str(source)).returncode == 0
    target = tmp_path / "out" / "result"
    target.parent.mkdir()
    target.write_text("the previous result\n")
    before = snapshot(tmp_path)
    proc = cli(*writers(source, analysis, str(target))[command], preexec_fn=file_size_limit(limit))
    assert_refused(proc, str(target), "cannot write: File too large")
    assert target.read_text() == "the previous result\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["result"]  # no temporary file
    assert unchanged(before, tmp_path)


@pytest.mark.parametrize("command", WRITERS)
def test_success_replaces_the_target_and_keeps_its_mode(store_copy: Path, analysis: Path,
                                                        tmp_path: Path, command: str) -> None:
    target = tmp_path / "result"
    target.write_text("old")
    target.chmod(0o640)
    proc = cli(*writers(store_copy, analysis, str(target))[command])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert target.read_text() != "old" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    dash = cli(*writers(store_copy, analysis, "-")[command])  # stdout: the same bytes
    assert dash.returncode == 0 and dash.stdout == target.read_text(), dash.stderr


def test_output_beside_the_store_is_no_input(store_copy: Path) -> None:
    """The README's workflow: the analysis and report live in the store's directory, and a
    second run replaces them."""
    analysis, page = store_copy / "analysis.json", store_copy / "report.html"
    for _ in range(2):
        assert cli("analyze", str(store_copy), "--json", str(analysis)).returncode == 0
        assert cli("report", str(analysis), "-o", str(page)).returncode == 0
    assert json.loads(analysis.read_text())["requests"] and page.stat().st_size


def test_stdout_gets_all_or_nothing(store_copy: Path, tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(store_copy / DB_FILE)
    last = conn.execute("SELECT max(id) FROM spans").fetchone()[0]
    conn.execute("UPDATE spans SET start_ns = 'late' WHERE id = ?", (last,))
    conn.commit()
    conn.close()
    for args in (["export", str(store_copy), "-o", "-"],
                 ["analyze", str(store_copy), "--json", "-"]):
        proc = cli(*args)
        assert_refused(proc, f"span row {last}")
        assert proc.stdout == ""  # not the spans before the damaged row


# --- export round trip -------------------------------------------------------------------------
def _post_lines(receiver: OTLPReceiver, text: str) -> None:
    for line in text.splitlines():
        request = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces", line.encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200


def test_export_round_trips_through_the_receiver(store_copy: Path, tmp_path: Path) -> None:
    exported = tmp_path / "export.json"
    assert cli("export", str(store_copy), "-o", str(exported)).returncode == 0
    text = exported.read_text()
    for line in text.splitlines():  # what the receiver's decoder accepts, span for span
        assert otlp_decode.decode_trace_request(otlp_decode.trace_request_from_json(
            json.loads(line)))
    receiver = OTLPReceiver(SpanStore(tmp_path / "again"), grpc_port=None)
    with receiver:
        _post_lines(receiver, text)
    receiver.store.close()

    def analysis_of(source: Path) -> dict:
        out = tmp_path / f"{source.name}.analysis.json"
        proc = cli("analyze", str(source), "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(out.read_text())
        assert doc.pop("source") == str(source)
        return doc

    expected = analysis_of(store_copy)
    assert expected["requests"] and expected["verdicts"]
    for source in (exported, tmp_path / "again"):
        assert analysis_of(source) == expected
        tree = cli("tree", str(source))
        assert tree.returncode == 0 and tree.stdout == cli("tree", str(store_copy)).stdout


def _nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def test_export_is_exactly_as_strict_as_the_receiver(tmp_path: Path) -> None:
    """An attribute nested as deep as the receiver takes is exported and read back; one level
    more is refused by both. Non-finite doubles are written in protobuf JSON's spelling."""
    def spans_file(levels: int) -> Path:
        path = tmp_path / f"spans{levels}.jsonl"
        path.write_text(json.dumps({
            "trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "s", "start_ns": 1, "end_ns": 2,
            "attributes": {"deep": _nested(levels), "nan": float("nan"),
                           "inf": float("-inf")}}) + "\n")
        return path

    deepest = next(n for n in range(30, 0, -1)
                   if cli("export", str(spans_file(n)), "-o", str(tmp_path / "x")).returncode == 0)
    exported = (tmp_path / "x").read_text()
    assert '"doubleValue":"NaN"' in exported and '"doubleValue":"-Infinity"' in exported
    otlp_decode.decode_trace_request(otlp_decode.trace_request_from_json(json.loads(exported)))
    refused = cli("export", str(spans_file(deepest + 1)), "-o", str(tmp_path / "y"))
    assert_refused(refused, "nested deeper than the receiver's 64 JSON levels")
    deeper = json.loads(exported)
    value = deeper["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][0]["value"]
    while "arrayValue" in value:
        value = value["arrayValue"]["values"][0]
    value.clear()
    value["arrayValue"] = {"values": [{"stringValue": "leaf"}]}  # one more level, by hand
    with pytest.raises(otlp_decode.OTLPDecodeError, match="deeper than 64"):
        otlp_decode.trace_request_from_json(deeper)
    assert not (tmp_path / "y").exists()


def test_sigterm_while_writing_leaves_no_temporary_file(store_copy: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM arrives halfway through an export: the command ends (128 + 15) and neither the
    output nor its temporary file is there; the handler is put back afterwards."""
    import signal

    from otel_ttft.tools import cli as cli_module
    from otel_ttft.tools.sink import otlp_encode

    real = otlp_encode.write_lines

    def interrupted(traces, out):
        out.write("{}\n")
        os.kill(os.getpid(), signal.SIGTERM)
        return real(traces, out)

    monkeypatch.setattr(otlp_encode, "write_lines", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    target = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["export", str(store_copy), "-o", str(target)])
    assert exc.value.code == 128 + signal.SIGTERM
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    assert signal.getsignal(signal.SIGTERM) is before
