"""The compile-cache reader on directories laid out as vLLM 0.32 writes them: empty, artifacts
under another key, under this start's key, a container's own disk, hostile content."""

from __future__ import annotations

import json
import os

from otel_ttft.runtime import compile_cache as cc
from otel_ttft.runtime import history_storage as hs

HOST = "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
DOCKER = "1021 915 0:120 / / rw,relatime master:420 - overlay overlay rw,upperdir=/u\n"


def _inspect(root, text=HOST, hints=(), **kw):
    return cc.inspect(root, mounts=hs.parse_mountinfo(text), hints=list(hints), environ={},
                      **kw)


def _non_aot(root, key="a1b2c3d4e5", files=3, factors=None):
    d = root / cc.COMPILE_DIR / key / "rank_0_0" / "backbone"
    d.mkdir(parents=True)
    for i in range(files):
        (d / f"artifact_{i}").write_bytes(b"x" * 100)
    (d / cc.FACTORS_FILE).write_text(json.dumps(factors or {
        "config_hash": "cfg1", "code_hash": "code1", "compiler_hash": "comp1", "env": {}}))
    return d


def _aot(root, key="f" * 64, size=1000):
    d = root / cc.COMPILE_DIR / cc.AOT_DIR / key
    (d / "rank_0_0").mkdir(parents=True)
    (d / "inductor_cache").mkdir()
    (d / "rank_0_0" / "model").write_bytes(b"m" * size)
    return d


def test_missing_and_empty_roots(tmp_path):
    state = _inspect(tmp_path)
    assert not state.exists and state.state_for(None) == cc.STATE_MISSING
    (tmp_path / cc.COMPILE_DIR / cc.AOT_DIR / ("0" * 64) / "rank_0_0").mkdir(parents=True)
    state = _inspect(tmp_path)
    assert state.exists and not state.with_artifacts
    assert state.state_for(str(tmp_path / cc.COMPILE_DIR / "x")) == cc.STATE_EMPTY


def test_keys_with_artifacts_and_the_key_a_start_used(tmp_path):
    used = _aot(tmp_path, "a" * 64)
    other = _non_aot(tmp_path, "0123456789")
    state = _inspect(tmp_path)
    assert {e.key for e in state.with_artifacts} == {"a" * 64, "0123456789"}
    aot = state.entry_for(used)
    assert aot.aot and aot.artifact_files == 1 and aot.artifact_bytes == 1000
    assert state.state_for(used) == cc.STATE_PRESENT
    # another key: this start's directory is not in the snapshot
    assert state.state_for(tmp_path / cc.COMPILE_DIR / cc.AOT_DIR / ("b" * 64)) \
        == cc.STATE_OTHER_KEYS
    non_aot = state.entry_for(other)  # a directory below the key
    assert non_aot.factors == {"config_hash": "cfg1", "code_hash": "code1",
                               "compiler_hash": "comp1"}
    summary = state.summary(used)
    assert summary["state"] == cc.STATE_PRESENT and summary["other_keys"] == ["0123456789"]
    assert summary["other_factors"]["config_hash"] == "cfg1"
    assert state.state_for(None) == cc.STATE_UNKNOWN


def test_a_cache_a_container_loses_and_one_it_keeps(tmp_path):
    lost = _inspect(tmp_path, DOCKER, ["/.dockerenv"])
    assert lost.kept is False and lost.in_container and "container" in lost.kept_why
    kept = _inspect(tmp_path)
    assert kept.kept is True and not kept.in_container


def test_bounded_listing_and_no_content_read(tmp_path):
    for i in range(5):
        _non_aot(tmp_path, f"{i:010d}", files=2)
    d = _aot(tmp_path)
    for i in range(50):
        (d / "inductor_cache" / f"f{i}").write_bytes(b"")
    state = _inspect(tmp_path, max_entries=3, max_files=10)
    assert len(state.entries) == 3 and state.truncated
    state = _inspect(tmp_path, max_files=10)
    assert next(e for e in state.entries if e.aot).truncated


def test_hostile_content_never_raises(tmp_path):
    top = tmp_path / cc.COMPILE_DIR
    top.mkdir()
    key = top / "deadbeef00" / "rank_0_0" / "backbone"
    key.mkdir(parents=True)
    (key / cc.FACTORS_FILE).write_text("{not json")
    (key / "artifact").write_bytes(b"x")
    os.mkfifo(key / "fifo")
    os.symlink("/nonexistent", key / "dangling")
    (top / "huge" / "rank_0_0" / "p").mkdir(parents=True)
    (top / "huge" / "rank_0_0" / "p" / cc.FACTORS_FILE).write_bytes(
        b"{" + b" " * (cc.MAX_FACTORS_BYTES + 10) + b"}")
    state = _inspect(tmp_path)
    entry = state.entry_for(key)
    assert entry.factors == {} and entry.artifact_files == 1
    # a file where the directory should be
    other = tmp_path / "other"
    other.mkdir()
    (other / cc.COMPILE_DIR).write_text("x")
    state = _inspect(other)
    assert not state.exists and "not a directory" in state.problem


def test_disabled_by_vllm_setting(tmp_path):
    state = cc.inspect(tmp_path, environ={"VLLM_DISABLE_COMPILE_CACHE": "1"},
                       mounts=hs.parse_mountinfo(HOST), hints=[])
    assert state.disabled


def test_doctor_says_what_the_next_start_will_find(tmp_path):
    from otel_ttft.tools import doctor

    lines = doctor._render_compile_cache(  # noqa: SLF001 - the report's own renderer
        _inspect(tmp_path, DOCKER, ["/.dockerenv"]).summary())
    assert lines[0].endswith("torch_compile_cache: no compile cache yet")
    assert "WARNING" in lines[1] and "volume" in lines[1]
    _aot(tmp_path)
    (line,) = doctor._render_compile_cache(_inspect(tmp_path).summary())  # noqa: SLF001
    assert line.endswith("artifacts under 1 key(s)")
