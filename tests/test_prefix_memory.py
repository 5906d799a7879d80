"""The prefix baseline beside the verdict's history: what warm requests found cached, kept
across a restart, bounded, and whatever is at its path never fails or blocks a server; the
EngineCore side ships vLLM's block hashes only for the requests that need them."""

from __future__ import annotations

import hashlib
import json
import os
import threading

from otel_ttft.runtime import activation_history
from otel_ttft.runtime import prefix_memory as pm
from otel_ttft.runtime.hooks.request import payload
from otel_ttft.runtime.hooks.request.engine import PREFIX_SAMPLE_EVERY, EngineRequests

BS = 128


def _hashes(*blocks: str) -> list[bytes]:
    """Chained like vLLM's: each block's hash stands for the whole prefix up to it."""
    out, prev = [], b""
    for b in blocks:
        prev = hashlib.sha256(prev + b.encode()).digest()
        out.append(prev)
    return out


def _memory(path, key="k") -> pm.PrefixMemory:
    m = pm.PrefixMemory()
    m.configure(key, "tiny", "sha256", hash_seed_set=False)
    m.load(path)
    return m


def test_warm_requests_found_cached_then_a_restart_recognises_the_prefix(tmp_path):
    path = tmp_path / pm.FILE_NAME
    shared = _hashes("system", "history", "turn-1")
    first = _memory(path)
    assert first.before is None  # nothing before the first start
    for _ in range(3):  # three warm turns read the shared 3 blocks from the cache
        first.found_cached([h[:8] for h in shared + _hashes("x")], BS, 4 * BS + 10, 3 * BS)
    assert first.save() is None
    data = json.loads(path.read_text())
    entry = data["models"]["k"]
    assert entry["requests"] == 3 and entry["cached_tokens"] == 9 * BS
    assert set(entry["blocks"]) == {h[:8].hex() for h in shared}

    after = _memory(path)  # the restart
    assert after.before.cached_share == 9 * BS / (3 * (4 * BS + 10))
    cold = [h[:8] for h in shared[:2]] + [b"otherend"]
    seen = after.seen(cold, BS, 3 * BS + 5)
    assert seen == pm.Seen(2 * BS, shared[1][:8].hex())  # its deepest known block
    assert after.seen([b"unknown!"], BS, BS) == pm.Seen(0, None)
    # what this process adds is not "before": a prefix first seen now is not a cold one
    after.found_cached([b"newblock"], BS, BS + 1, BS)
    assert after.seen([b"newblock"], BS, BS + 1).tokens == 0


def test_blocks_per_model_and_models_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(pm, "MAX_BLOCKS", 10)
    monkeypatch.setattr(pm, "MAX_MODELS", 2)
    path = tmp_path / pm.FILE_NAME
    for key in ("a", "b", "c"):
        m = _memory(path, key)
        for i in range(40):  # block 0 found by every request, the others once
            m.found_cached([b"always!!", i.to_bytes(8, "big")], BS, 2 * BS, 2 * BS)
        assert len(m.table.blocks) <= 2 * 10 + 1
        assert m.save() is None
    models = json.loads(path.read_text())["models"]
    assert set(models) == {"b", "c"}  # the oldest model went
    assert len(models["c"]["blocks"]) == 10 and models["c"]["blocks"][b"always!!".hex()] == 40


def test_per_process_hash_seed_keeps_nothing(tmp_path):
    m = pm.PrefixMemory()
    m.configure("k", "tiny", "xxhash", hash_seed_set=False)
    m.load(tmp_path / pm.FILE_NAME)
    m.found_cached([b"aaaaaaaa"], BS, BS, BS)
    assert "PYTHONHASHSEED" in m.problem and m.save() is None
    assert not (tmp_path / pm.FILE_NAME).exists()
    seeded = pm.PrefixMemory()
    seeded.configure("k", "tiny", "xxhash", hash_seed_set=True)
    assert seeded.problem is None


def test_hostile_files_read_as_no_baseline_and_foreign_ones_stay(tmp_path):
    path = tmp_path / pm.FILE_NAME
    path.write_text("{not json")
    m = _memory(path)
    assert m.before is None and "not valid JSON" in m.problem
    path.write_text(json.dumps({"format": "someone-else", "models": {}}))
    m = _memory(path)
    m.problem = None  # a foreign file is never overwritten
    m.found_cached([b"aaaaaaaa"], BS, BS, BS)
    assert "not an" in m.save() and "someone-else" in path.read_text()
    path.unlink()
    os.mkfifo(path)
    m = _memory(path)  # opened without blocking
    assert m.before is None and "not a regular file" in m.problem
    path.unlink()
    path.write_bytes(b"x" * (pm.MAX_BYTES + 10))
    assert "larger than" in _memory(path).problem
    path.unlink()
    path.write_text(json.dumps({"format": pm.FORMAT, "version": pm.VERSION, "models": {
        "k": {"blocks": {"short": 1, "0" * 16: -3, "1" * 16: 2}, "hash_tokens": BS,
              "requests": 1, "prompt_tokens": 10, "cached_tokens": 5}}}))
    assert set(_memory(path).before.blocks) == {"1" * 16}  # bad entries dropped


def test_saves_take_the_histories_lock(tmp_path):
    path = tmp_path / pm.FILE_NAME
    m = _memory(path)
    m.found_cached([b"aaaaaaaa"], BS, BS, BS)
    lock = path.with_name(path.name + ".lock")
    held, release = threading.Event(), threading.Event()

    def hold():
        with activation_history.locked(lock):
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    assert "stayed held" in m.save()
    release.set()
    t.join()
    assert m.save() is None  # what the held lock kept back goes with the next save
    m.found_cached([b"bbbbbbbb"], BS, BS, BS)
    assert m.save() is None
    assert len(json.loads(path.read_text())["models"]["k"]["blocks"]) == 2


def test_enginecore_ships_hashes_for_the_cold_window_and_a_sample():
    part = EngineRequests(cold_requests=3)
    wanted = [part.wants_prefix() for _ in range(3 + 4 * PREFIX_SAMPLE_EVERY)]
    assert wanted[:3] == [True] * 3
    assert sum(wanted[3:]) == 4


def test_payload_carries_the_first_bytes_of_the_hashes_and_reads_them_back():
    entry = payload.EnginePayload(1.0, 0, 0, 10, 10)
    entry.block_hashes = [bytes(range(i % 200, i % 200 + 32)) for i in range(300)]
    entry.hash_tokens = BS
    got = payload.decode(payload.encode(entry))
    assert got.prefix.tokens == BS and len(got.prefix.hashes) == payload.MAX_PREFIX_BLOCKS
    assert got.prefix.hashes[1] == bytes(range(1, 9))
    assert payload.decode(payload.encode(payload.EnginePayload(1.0, 0, 0, 1, 1))).prefix is None


def test_a_wake_up_measures_against_what_this_process_found_before_it_slept(tmp_path):
    m = _memory(tmp_path / pm.FILE_NAME)
    m.found_cached([b"prefix-1", b"prefix-2"], BS, 3 * BS, 2 * BS)
    assert m.seen([b"prefix-1", b"prefix-2"], BS, 3 * BS).tokens == 0  # not before this start
    m.rebase()  # it slept and woke
    assert m.seen([b"prefix-1", b"prefix-2"], BS, 3 * BS) == pm.Seen(2 * BS, b"prefix-2".hex())


def test_enginecore_counts_a_wake_up_as_a_new_cold_window():
    class Activations:
        latest = None

    acts = Activations()
    part = EngineRequests(cold_requests=2, activations=acts)
    assert [part.wants_prefix() for _ in range(3)] == [True, True, False]
    acts.latest = object()  # a wake-up ended here
    assert [part.wants_prefix() for _ in range(3)] == [True, True, False]


def test_models_saved_in_the_same_millisecond_keep_the_newest(tmp_path, monkeypatch):
    """A tie on the saved time (a fast host, a coarse clock) keeps the file's newest-first order."""
    monkeypatch.setattr(pm.time, "time", lambda: 1_000.0)
    test_blocks_per_model_and_models_are_bounded(tmp_path, monkeypatch)
