"""The cold/warm signal on shard spans: page-cache residency before a read."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_ttft.runtime.hooks.load import pagecache


@pytest.fixture
def big_file(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(os.urandom(8 << 20))
    os.sync()
    return path


def test_resident_ratio_tells_cold_from_warm(big_file):
    if pagecache.filesystem_type(big_file) in ("tmpfs", "ramfs"):
        pytest.skip("tmpfs pages cannot be evicted")
    assert pagecache.evict(big_file)
    cold = pagecache.resident_ratio(big_file)
    big_file.read_bytes()
    warm = pagecache.resident_ratio(big_file)
    assert cold is not None and warm is not None
    assert cold < 0.5 <= warm
    assert warm == pytest.approx(1.0, abs=0.01)


def test_missing_file_gives_none_not_an_error(tmp_path):
    assert pagecache.resident_ratio(tmp_path / "absent") is None


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="findmnt (util-linux) not installed")
@pytest.mark.parametrize("where", ["big_file", "/dev/shm", "/proc/self"])
def test_filesystem_type_is_what_findmnt_says(where, big_file):
    path = big_file if where == "big_file" else Path(where)
    told = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)],
                          capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert told and pagecache.filesystem_type(path) == told[-1]  # stacked: the top one serves


def test_filesystem_type_is_the_longest_mount_point_holding_the_real_path(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\n"
                      "short /da nfs rw 0 0\n"  # a prefix of /data, not a parent of it
                      "disk /data xfs rw 0 0\n"
                      "nvme /data/models btrfs rw 0 0\n"
                      "garbage\n")
    link = tmp_path / "link"
    link.symlink_to("/data/models/llama")
    assert pagecache.filesystem_type("/data/x", mounts) == "xfs"
    assert pagecache.filesystem_type("/data", mounts) == "xfs"
    assert pagecache.filesystem_type("/data/models/llama/a.safetensors", mounts) == "btrfs"
    assert pagecache.filesystem_type(link, mounts) == "btrfs"  # the path it resolves to
    assert pagecache.filesystem_type("/database", mounts) == "ext4"
    assert pagecache.filesystem_type("/data/x", tmp_path / "absent") is None
