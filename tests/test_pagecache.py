"""The cold/warm signal on shard spans: page-cache residency before a read."""

from __future__ import annotations

import os

import pytest

from otel_ttft import pagecache


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


def test_filesystem_type_is_read_from_mounts(big_file):
    assert pagecache.filesystem_type(big_file)
