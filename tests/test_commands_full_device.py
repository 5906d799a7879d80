"""A full device, on every write path of the commands: the message says the device is full and
names where. Three ways a user meets one:

- the output aimed at ``/dev/full`` (a device: refused before anything is read, in words that
  say writing there fails as a full disk does);
- a real full file system (a 64 KiB tmpfs, filled): the temporary file beside the target gets
  ENOSPC from the kernel; the previous target stays as it was and no temporary file is left;
- what a command prints, sent to a full device (``> /dev/full``).

The tmpfs needs root and ``mount``; without them that test is skipped, the others run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ttft.tools.replay import verify
from tests.analysis_fixture import build_analysis
from tests.hostile_store import assert_refused, cli, full_device, snapshot, unchanged

WRITERS = ("export", "analyze", "report", "prometheus")


def writer(command: str, store: Path, analysis: Path, target: str) -> list[str]:
    return {"export": ["export", str(store), "-o", target],
            "analyze": ["analyze", str(store), "--json", target],
            "report": ["report", str(analysis), "-o", target],
            "prometheus": ["prometheus", "--dir", str(store), "--openmetrics", target]}[command]


@pytest.fixture
def analysis(tmp_path: Path) -> Path:
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(build_analysis(repeat=1)))
    return path


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs holding ``result`` (the previous output) and a filler that takes every
    block left: any new file's first write there fails with ENOSPC."""
    mount = tmp_path / "full-fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        (mount / "result").write_text("the previous result\n")
        with (mount / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("command", WRITERS)
def test_dev_full_as_the_output_says_it_is_full(store_copy: Path, analysis: Path,
                                                tmp_path: Path, command: str) -> None:
    device = full_device(tmp_path)  # /dev/full itself, or a private node of the same device
    proc = cli(*writer(command, store_copy, analysis, str(device)))
    assert_refused(proc, f"otel-ttft {command}: {device}: ",
                   "always full (no space left on device)")


def test_verify_refuses_dev_full_before_it_runs(analysis: Path, tmp_path: Path) -> None:
    device = full_device(tmp_path)
    proc = cli("verify", str(analysis), "--out", str(tmp_path / "verify"), "--json", str(device))
    assert_refused(proc, f"otel-ttft verify: --json {device}: ",
                   "always full (no space left on device)")
    assert not (tmp_path / "verify").exists()  # refused before anything ran


@pytest.mark.parametrize("command", WRITERS)
def test_a_full_file_system_is_named(store_copy: Path, analysis: Path, full_fs: Path,
                                     command: str) -> None:
    target = full_fs / "result"
    before = snapshot(full_fs)
    proc = cli(*writer(command, store_copy, analysis, str(target)))
    assert_refused(proc, f"otel-ttft {command}: {target}: cannot write: no space left on "
                   f"device (the file system holding {full_fs} is full)")
    assert target.read_text() == "the previous result\n"
    assert sorted(p.name for p in full_fs.iterdir()) == ["filler", "result"]  # no temporary
    assert unchanged(before, full_fs)


def test_verify_output_on_a_full_file_system(analysis: Path, full_fs: Path) -> None:
    """``verify`` writes its analysis.json by the same rule (its runs need vLLM; the write is
    called as the command calls it, into the real full file system)."""
    target = full_fs / "result"
    with pytest.raises(verify.VerifyError, match="no space left on device") as caught:
        verify._write_json(target, json.loads(analysis.read_text()))
    assert str(target) in str(caught.value) and str(full_fs) in str(caught.value)
    assert target.read_text() == "the previous result\n"
    assert sorted(p.name for p in full_fs.iterdir()) == ["filler", "result"]


@pytest.mark.parametrize("args", [["tree", "STORE"], ["analyze", "STORE"],
                                  ["export", "STORE", "-o", "-"], ["report", "ANALYSIS", "-o", "-"],
                                  ["check", "ANALYSIS", "ANALYSIS"]],
                         ids=lambda a: " ".join(a))
def test_printed_output_on_a_full_device(store_copy: Path, analysis: Path, tmp_path: Path,
                                         args: list[str]) -> None:
    device = full_device(tmp_path)
    argv = [{"STORE": str(store_copy), "ANALYSIS": str(analysis)}.get(a, a) for a in args]
    with device.open("w") as stdout:
        proc = subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", *argv],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60)
    assert_refused(proc, f"otel-ttft {args[0]}: stdout: cannot write: no space left on device")
