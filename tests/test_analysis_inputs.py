"""Hostile inputs to `report` and `check`: one line on stderr, exit 2, never a traceback.

`report` runs as a real process for every case; `check` shares the loader and runs in-process
(``main(argv)``: a traceback would be an exception here) to keep the suite quick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft.tools.analysis.contract import MAX_FILE_BYTES
from otel_ttft.tools.cli import main
from tests.analysis_fixture import build_analysis


def good() -> dict:
    return build_analysis(repeat=1)


def _set(path: str, value):
    def make() -> str:
        data = good()
        *keys, last = path.split(".")
        node = data
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is _DELETE:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
        return json.dumps(data)
    return make


_DELETE = object()
VALID = json.dumps(good())

CASES = {
    "empty": lambda: "",
    "whitespace": lambda: "  \n\t ",
    "garbage": lambda: "this is not json {",
    "binary": lambda: b"\x89PNG\r\n\x1a\n\x00\xff\xfe".decode("latin-1"),
    "truncated": lambda: VALID[: len(VALID) // 2],
    "array": lambda: "[1, 2, 3]",
    "string": lambda: '"otel-ttft/analysis/v1"',
    "no-schema": _set("schema", _DELETE),
    "other-schema": _set("schema", "otel-ttft/analysis/v2"),
    "schema-wrong-type": _set("schema", {"v": 1}),
    "no-run": _set("run", _DELETE),
    "run-is-list": _set("run", []),
    "ttft-as-string": _set("requests.0.client_ttft_s", "0.5"),
    "negative-duration": _set("requests.0.segments.0.duration_s", -1),
    "nan": lambda: VALID.replace('"client_ttft_s": ', '"client_ttft_s": NaN, "x": ', 1),
    "infinity": _set("requests.0.client_ttft_s", 1e308 * 10),  # json writes Infinity
    "overflow-float": lambda: VALID.replace('"client_ttft_s": ', '"client_ttft_s": 1e400, "x": ',
                                           1),
    "huge-int": lambda: VALID.replace('"concurrency": 1', '"concurrency": ' + "9" * 5000),
    "bool-as-int": _set("run.concurrency", True),
    "missing-stage": _set("requests.0.stages.queue", _DELETE),
    "scenarios-list": _set("scenarios", [1]),
    "long-name": _set("requests.0.model", "m" * 5000),
    "deep-array": lambda: "[" * 200_000 + "]" * 200_000,
    "deep-evidence": lambda: VALID.replace(
        '"evidence": {', '"evidence": {"x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + ", ",
        1),
}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 600, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture
def valid(tmp_path: Path) -> Path:
    path = tmp_path / "good.json"
    path.write_text(VALID)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_refuses_bad_input(tmp_path: Path, case: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(CASES[case](), encoding="latin-1" if case == "binary" else "utf-8")
    out = tmp_path / "report.html"
    assert_refused(run("report", str(bad), "-o", str(out)), "otel-ttft report:", str(bad))
    assert not out.exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_bad_input_either_side(tmp_path: Path, valid: Path, case: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(CASES[case](), encoding="latin-1" if case == "binary" else "utf-8")
    for argv in (["check", str(bad), str(valid)], ["check", str(valid), str(bad)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"otel-ttft check: {bad}:") and err.count("\n") == 1, err


def test_messages_say_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    expect = {"empty": "empty file", "truncated": "not valid JSON", "array": "expected a JSON "
              "object", "other-schema": "expected 'otel-ttft/analysis/v1'",
              "ttft-as-string": "requests.0.client_ttft_s", "deep-array": "nested too deeply",
              "missing-stage": "lacks queue", "nan": "NaN"}
    for case, needle in expect.items():
        bad.write_text(CASES[case]())
        assert_refused(run("check", str(bad), str(bad)), needle)


def test_missing_directory_and_oversized_files(tmp_path: Path, valid: Path) -> None:
    assert_refused(run("report", str(tmp_path / "nope.json")), "no such file")
    assert_refused(run("check", str(valid), str(tmp_path)), "is a directory")
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: costs no disk
    assert_refused(run("report", str(huge)), "larger than the 64 MiB cap")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes: reading it would block forever
    assert_refused(run("report", str(fifo)), "not a regular file")
    assert_refused(run("check", "/dev/zero", str(valid)), "not a regular file")


def test_report_refuses_unwritable_output(tmp_path: Path, valid: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_refused(run("report", str(valid), "-o", str(blocker / "report.html")), "cannot write")
    assert_refused(run("report", str(valid), "-o", str(tmp_path / "no" / "dir" / "r.html")),
                   "cannot write")
    assert_refused(run("report", str(valid), "-o", str(tmp_path)), "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "good.json"]


def test_check_refuses_bad_thresholds(tmp_path: Path, valid: Path) -> None:
    assert_refused(run("check", str(valid), str(valid), "--stage", "nonsense=1"), "unknown stage")
    assert_refused(run("check", str(valid), str(valid), "--min-delta-s", "-3"), "--min-delta-s")
    assert_refused(run("check", str(valid), str(valid), "--thresholds", str(tmp_path / "x")),
                   "no such file")
    toml = tmp_path / "t.toml"
    toml.write_bytes(b"\xff\xfe[stages")
    assert_refused(run("check", str(valid), str(valid), "--thresholds", str(toml)), "TOML")


def test_commands_succeed_on_good_input(tmp_path: Path, valid: Path) -> None:
    proc = run("report", str(valid), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0 and proc.stderr == "" and (tmp_path / "r.html").stat().st_size
    # evidence nested as deep as JSON parsing allows still renders (shown, or elided)
    deep = VALID.replace('"evidence": {', '"evidence": {"deep": ' + "[" * 980 + "]" * 980 + ", ")
    (tmp_path / "deep.json").write_text(deep)
    proc = run("report", str(tmp_path / "deep.json"), "-o", str(tmp_path / "deep.html"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    proc = run("check", str(valid), str(valid))
    assert proc.returncode == 0 and proc.stdout.startswith("ok: ")
