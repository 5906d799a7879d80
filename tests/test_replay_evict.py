"""Cold means cold, on real files and real processes (no vLLM): a checkpoint just written leaves
the page cache (written back first), one another process maps and has touched does not, and the
check says who holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.runtime.hooks.load import pagecache
from otel_ttft.tools.replay import evict

HOLDER = """
import mmap, sys
maps = []
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))
    maps.append(m)
print("ready", flush=True)
sys.stdin.read()
"""


def checkpoint(tmp_path: Path) -> Path:
    """A model directory written just now: its pages are dirty."""
    model = tmp_path / "model"
    model.mkdir()
    for i in range(3):
        (model / f"model-0000{i}.safetensors").write_bytes(os.urandom(1 << 20))
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def model(tmp_path: Path) -> Path:
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 65536)
    if pagecache.resident_ratio(probe) is None:
        pytest.skip("this platform cannot measure page-cache residency (mincore)")
    os.sync()
    pagecache.evict(probe)
    if (pagecache.resident_ratio(probe) or 0) > 0:
        pytest.skip(f"{pagecache.filesystem_type(probe)} keeps clean pages despite the advice")
    return checkpoint(tmp_path)  # after the sync: its pages are dirty


def test_a_checkpoint_written_just_now_leaves_the_cache_once_written_back(model: Path) -> None:
    assert evict.resident(model) == 1.0
    dirty = evict.checkpoint_files(model)[0]
    fd = os.open(dirty, os.O_RDONLY)
    try:  # the advice alone, as the replay used to give it: dirty pages stay
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert pagecache.resident_ratio(dirty) == 1.0
    evict.evict(model)
    check = evict.make_cold(model, evict.ColdCheck(attempts=1))
    assert check.resident == 0.0 and check.cold is True and check.attempts == 1
    assert check.attributes() == {semconv.ATTR_REPLAY_EVICT_ATTEMPTS: 1,
                                  semconv.ATTR_REPLAY_EVICT_RESIDENT: 0.0,
                                  semconv.ATTR_REPLAY_EVICT_COLD: True}


def test_a_checkpoint_another_process_maps_stays_and_the_holder_is_named(model: Path) -> None:
    shards = evict.checkpoint_files(model)
    assert [p.suffix for p in shards] == [".safetensors"] * 3  # weights, not the config
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, *map(str, shards)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        evict.evict(model)
        check = evict.make_cold(model, evict.ColdCheck(attempts=1))
        assert check.cold is False and check.resident > 0.9
        assert check.attempts == 2  # measured, evicted once more, measured again
        assert [h.split()[0] for h in check.held_by] == [str(holder.pid)]
        assert check.attributes()[semconv.ATTR_REPLAY_EVICT_HELD_BY] == check.held_by
    finally:
        holder.stdin.close()
        holder.wait(30)
    evict.evict(model)  # the holder gone, the advice takes
    assert evict.resident(model) == 0.0 and evict.mapped_by(model) == []


def test_the_private_copy_is_reused_while_its_files_match(tmp_path: Path) -> None:
    src = checkpoint(tmp_path)
    copy = evict.private_copy(src, tmp_path / "own")
    assert copy == tmp_path / "own" / "model" and copy.name == src.name
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in src.iterdir())
    marker = copy / "config.json"
    stamp = marker.stat().st_mtime_ns
    assert evict.private_copy(src, tmp_path / "own") == copy
    assert marker.stat().st_mtime_ns == stamp  # not copied again
    (src / "model-00009.safetensors").write_bytes(b"new")
    assert (evict.private_copy(src, tmp_path / "own") / "model-00009.safetensors").exists()
    assert [p.name for p in (tmp_path / "own").iterdir()] == ["model"]  # no temp left
