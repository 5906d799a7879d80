"""The live verdict's history file under hostile content: whatever is at the path reads as "no
baseline" with a reason, never raises, never blocks, and a file that is not ours is never
overwritten; two writers at once both keep their records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otel_ttft.runtime import activation_history as history

ROOT = Path(__file__).resolve().parents[1]


def record(i: int, key: str = "k", duration: float = 40.0) -> dict:
    return {"id": f"{i:032x}", "key": key, "model": "tiny", "kind": "start", "at": float(i),
            "duration_s": duration, "stages": {"warmup.compile": 10.0, "load.read": 1.0},
            "evidence": {"compile_cache_hit": False}, "facts": {}}


def test_missing_file_is_no_baseline_without_a_problem_and_save_creates_it(tmp_path):
    path = tmp_path / "cache" / "otel-ttft" / "activations.json"
    loaded = history.load(path)
    assert (loaded.records, loaded.problem, loaded.ours) == ([], None, True)
    assert history.save(path, record(1)) is None
    assert [r["id"] for r in history.load(path).records] == [record(1)["id"]]
    data = json.loads(path.read_text())
    assert data["format"] == history.FORMAT and data["version"] == history.VERSION
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_record_is_replaced_by_id_and_each_key_keeps_its_newest(tmp_path):
    path = tmp_path / "h.json"
    for i in range(history.PER_KEY + 5):
        assert history.save(path, record(i)) is None
    assert history.save(path, record(0, key="other")) is None
    again = dict(record(history.PER_KEY + 4), duration_s=99.0)
    assert history.save(path, again) is None
    records = history.load(path).records
    mine = [r for r in records if r["key"] == "k"]
    assert [r["at"] for r in mine] == [float(i) for i in range(5, history.PER_KEY + 5)]
    assert mine[-1]["duration_s"] == 99.0
    assert [r["key"] for r in records].count("other") == 1


@pytest.mark.parametrize("content", [b"\x00\xffgarbage", b"[1, 2, 3]", b'{"hello": "world"}',
                                     b"not json at all"])
def test_a_foreign_file_is_no_baseline_and_never_overwritten(tmp_path, content):
    path = tmp_path / "h.json"
    path.write_bytes(content)
    loaded = history.load(path)
    assert loaded.records == [] and loaded.problem and loaded.ours is False
    assert history.save(path, record(1)) is not None
    assert path.read_bytes() == content


def test_our_file_truncated_is_no_baseline_and_started_afresh(tmp_path):
    path = tmp_path / "h.json"
    for i in range(3):
        history.save(path, record(i))
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    loaded = history.load(path)
    assert loaded.records == [] and "not valid JSON" in loaded.problem and loaded.ours
    assert history.save(path, record(7)) is None
    assert [r["at"] for r in history.load(path).records] == [7.0]


def test_records_of_the_wrong_shape_are_left_out(tmp_path):
    path = tmp_path / "h.json"
    bad = [dict(record(1), duration_s=float("nan")), dict(record(2), duration_s=-1),
           dict(record(3), stages={"warmup.compile": "slow"}), dict(record(4), key=5),
           dict(record(5), cold={"ttft_s": 1e9, "stages": {}}), "a string", None]
    path.write_text(json.dumps({"format": history.FORMAT, "version": 1,
                                "records": [*bad, record(6)]}))
    assert [r["at"] for r in history.load(path).records] == [6.0]


def test_a_huge_file_is_not_read(tmp_path):
    ours, foreign = tmp_path / "ours.json", tmp_path / "foreign.json"
    head = json.dumps({"format": history.FORMAT, "version": 1, "records": []})[:-2]
    ours.write_text(head + " " * (history.MAX_BYTES + 10) + "]}")
    foreign.write_bytes(b"x" * (history.MAX_BYTES + 10))
    for path, is_ours in ((ours, True), (foreign, False)):
        loaded = history.load(path)
        assert loaded.records == [] and "larger than" in loaded.problem
        assert loaded.ours is is_ours
    assert history.save(foreign, record(1)) is not None
    assert foreign.stat().st_size == history.MAX_BYTES + 10
    assert history.save(ours, record(1)) is None  # ours: started afresh, small again
    assert [r["at"] for r in history.load(ours).records] == [1.0]


def test_a_fifo_neither_blocks_a_read_nor_is_replaced(tmp_path):
    path = tmp_path / "h.json"
    os.mkfifo(path)
    result: list = []
    reader = threading.Thread(target=lambda: result.append(history.load(path)), daemon=True)
    reader.start()
    reader.join(30)  # a hang would leave the thread alive
    assert not reader.is_alive()
    assert result[0].records == [] and "not a regular file" in result[0].problem
    assert history.save(path, record(1)) is not None
    assert path.is_fifo()


def test_a_fifo_as_the_lock_is_refused(tmp_path):
    path = tmp_path / "h.json"
    os.mkfifo(tmp_path / "h.json.lock")
    assert "not a regular file" in history.save(path, record(1))
    assert not path.exists()


def test_an_unwritable_place_is_a_reason_not_an_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "otel-ttft" / "activations.json"  # its parent cannot be a directory
    assert history.load(path).records == []
    assert "cannot create" in history.save(path, record(1))
    directory = tmp_path / "dir.json"
    directory.mkdir()
    assert "not a regular file" in history.load(directory).problem
    assert history.save(directory, record(1)) is not None


def test_a_lock_held_elsewhere_is_waited_for_a_bounded_time(tmp_path, monkeypatch):
    import fcntl

    path = tmp_path / "h.json"
    monkeypatch.setattr(history, "LOCK_WAIT_S", 0.2)
    with open(tmp_path / "h.json.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        outcome: list = []
        writer = threading.Thread(target=lambda: outcome.append(history.save(path, record(1))),
                                  daemon=True)
        writer.start()
        writer.join(30)
        assert not writer.is_alive()
        assert "stayed held" in outcome[0]
    assert history.save(path, record(1)) is None


WRITER = """
import sys
from pathlib import Path
from otel_ttft.runtime import activation_history as history
path, who = Path(sys.argv[1]), sys.argv[2]
for i in range(25):
    r = {"id": f"{who}-{i}", "key": f"{who}-{i}", "model": "m", "kind": "start", "at": i,
         "duration_s": 1.0, "stages": {}, "evidence": {}, "facts": {}}
    problem = history.save(path, r)
    assert problem is None, problem
"""


def test_two_servers_saving_at_once_both_keep_every_record(tmp_path):
    path = tmp_path / "h.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who], env=env)
             for who in ("a", "b")]
    assert [p.wait(120) for p in procs] == [0, 0]
    ids = {r["id"] for r in history.load(path).records}
    assert ids == {f"{who}-{i}" for who in "ab" for i in range(25)}


def test_settings_point_it_elsewhere_or_switch_it_off(monkeypatch, tmp_path):
    monkeypatch.delenv("OTEL_TTFT_VERDICT_HISTORY", raising=False)
    assert history.default_path("/var/cache/vllm") == Path(
        "/var/cache/vllm/otel-ttft/activations.json")
    assert history.default_path(None) is None
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(tmp_path / "x.json"))
    assert history.default_path("/var/cache/vllm") == tmp_path / "x.json"
    for value, on in (("", True), ("true", True), ("false", False), ("0", False), ("OFF", False)):
        monkeypatch.setenv("OTEL_TTFT_VERDICT", value)
        assert history.enabled() is on
