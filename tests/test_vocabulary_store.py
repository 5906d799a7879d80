"""vLLM's vocabulary as data: shipped per vLLM version, free of this host's paths, the same as the
reader reads from the installed vLLM now; for a version with none shipped, the reader run once in
a subprocess and kept on disk (the live verdict's note says so), a broken reader or cache said in
one line."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from otel_ttft.diagnosis import vocabulary_store as store

SHIPPED = Path(store.__file__).with_name(store.SHIPPED_DIR)


def _fake_reader(data: dict) -> list[str]:
    """An interpreter that prints ``data`` as the reader does."""
    return [sys.executable, "-c", f"print({store.MARK!r} + {json.dumps(json.dumps(data))})"]


def test_every_shipped_vocabulary_is_named_by_its_version_and_free_of_host_paths():
    files = sorted(SHIPPED.glob("*.json"))
    assert [f.stem for f in files] == store.shipped_versions() and "0.32.0" in \
        store.shipped_versions()
    for path in files:
        text = path.read_text()
        data = json.loads(text)
        assert data["vllm_version"] == path.stem and store.shipped(path.stem) == data
        assert len(data["options"]) > 100 and "VLLM_CACHE_ROOT" in data["env"]
        for host_path in (str(Path.home()), "/tmp/", "site-packages", os.getcwd()):
            assert host_path not in text, (path.name, host_path)
        assert data["env_defaults"]["VLLM_CACHE_ROOT"].startswith("~")
        assert isinstance(data["loader_packages"], list)  # installed or not: this host's fact


def test_the_data_is_made_this_hosts_where_it_is_used(monkeypatch):
    data = store.shipped("0.32.0")
    vocab = store.for_host(data)
    assert vocab.env_defaults["VLLM_CACHE_ROOT"] == os.path.expanduser("~/.cache/vllm")
    assert all(isinstance(v, bool) for v in vocab.loader_packages.values())
    assert set(vocab.loader_packages) == set(data["loader_packages"])
    assert store.for_host(data, "/srv/c/vllm").env_defaults["VLLM_CACHE_ROOT"] == "/srv/c/vllm"
    assert vocab.has_flag("--max-model-len") and vocab.dest("--max-model-len") == "max_model_len"


@pytest.mark.parametrize("version", [None, "", "../0.32.0", "0.32.0/../x", "9.9.9"])
def test_no_shipped_data_for_a_version_not_shipped_or_not_a_version(version):
    assert store.shipped(version) is None


def test_a_version_with_none_shipped_is_read_once_and_kept(tmp_path):
    data = dict(store.shipped("0.32.0"), vllm_version="0.0.1.dev0")
    cache = tmp_path / "k" / "v.json"
    first = store.load("0.0.1.dev0", argv=_fake_reader(data), cache=cache, timeout_s=60)
    assert first.source == "read" and first.vocabulary.vllm_version == "0.0.1.dev0"
    assert "vLLM 0.0.1.dev0's vocabulary is not shipped with otel-ttft" in first.note
    assert str(cache) in first.note and json.loads(cache.read_text()) == data
    broken = [sys.executable, "-c", "raise SystemExit(3)"]
    again = store.load("0.0.1.dev0", argv=broken, cache=cache, timeout_s=60)
    assert again.source == "cached" and again.vocabulary == first.vocabulary
    shipped = store.load("0.32.0", argv=broken, cache=cache, timeout_s=60)
    assert shipped.source == "shipped" and shipped.note is None


def test_a_broken_reader_or_cache_is_one_line(tmp_path):
    cache = tmp_path / "v.json"
    cache.write_text("{not json")
    failing = [sys.executable, "-c", "import sys; print('no vLLM here', file=sys.stderr); "
               "raise SystemExit(1)"]
    with pytest.raises(store.VocabularyUnavailable, match=r"exit 1.*: no vLLM here$"):
        store.load("0.0.1.dev0", argv=failing, cache=cache, timeout_s=60)
    cache.write_text(json.dumps({"options": {"--x": {}}}))  # JSON, but not a vocabulary
    data = dict(store.shipped("0.32.0"), vllm_version="0.0.1.dev0")
    again = store.load("0.0.1.dev0", argv=_fake_reader(data), cache=cache, timeout_s=60)
    assert again.source == "read" and json.loads(cache.read_text()) == data
    with pytest.raises(store.VocabularyUnavailable, match="malformed"):
        store.load("0.0.1.dev0", argv=_fake_reader({"options": {"--x": {}}}), cache=None,
                   timeout_s=60)
    with pytest.raises(store.VocabularyUnavailable, match="TimeoutExpired"):
        store.load("0.0.1.dev0", argv=[sys.executable, "-c", "import time; time.sleep(30)"],
                   cache=None, timeout_s=0.5)


def test_the_live_verdict_reads_an_unshipped_version_with_the_reader_tool(tmp_path, monkeypatch):
    """In the server (``vllm.__version__`` with none shipped): the reader tool by module name in
    a subprocess of the server's interpreter, kept under ``$OTEL_TTFT_CACHE``; the note says so."""
    from otel_ttft.runtime.hooks import activation_verdict

    seen = []

    def probe(argv, timeout_s):
        seen.append(argv)
        return dict(store.shipped("0.32.0"), vllm_version="0.0.1.dev0")

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.0.1.dev0"))
    monkeypatch.setenv("OTEL_TTFT_CACHE", str(tmp_path))
    monkeypatch.setattr(store, "probe", probe)
    vocab, error, note = activation_verdict._vocabulary()
    assert error is None and vocab.vllm_version == "0.0.1.dev0"
    assert seen == [[sys.executable, "-m", "otel_ttft.tools.vllm_vocabulary", "--json-line"]]
    assert "not shipped with otel-ttft: read from its argument parser on first use" in note
    if store.vllm_dir() is not None:
        assert str(tmp_path / "vllm-knobs") in note


@pytest.mark.vllm_import
def test_the_shipped_vocabulary_is_what_the_installed_vllm_says_now():
    """The reader tool, run as the live verdict runs it, on the installed vLLM: the data shipped
    for its version is current (else: ``python -m otel_ttft.tools.vllm_vocabulary --write
    otel_ttft/diagnosis/vllm_vocabulary``)."""
    version = store.installed_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    read = store.probe([sys.executable, "-m", store.READER, "--json-line"], 600)
    assert read["vllm_version"] == version
    shipped = store.shipped(version)
    if shipped is None:
        pytest.skip(f"no vocabulary shipped for vLLM {version}")
    assert read == shipped
