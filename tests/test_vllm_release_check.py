"""scripts/vllm-release-check without installing anything: what it leaves out of vLLM's
requirements, and a version it refuses before touching the disk."""

from __future__ import annotations

import pytest

from scripts import vllm_release_check as check


@pytest.mark.parametrize(("name", "left_out"), [
    ("nvidia-cutlass-dsl", True), ("flashinfer-python", True), ("tilelang", True),
    ("PyNvVideoCodec", True), ("torchvision", True), ("humming-kernels", True),
    ("torch", False), ("transformers", False), ("opentelemetry-sdk", False), ("xgrammar", False),
])
def test_gpu_only_packages_are_left_out_and_the_rest_kept(name, left_out):
    assert bool(check.GPU_ONLY.match(name)) is left_out


def test_a_bad_version_is_refused_before_any_install(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        check.main(["0.33; rm -rf /", "--venv", str(tmp_path / "venv")])
    assert exc.value.code == 2
    assert "not a version" in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


@pytest.mark.vllm_import
def test_the_releases_vocabulary_is_written_as_the_package_ships_it(tmp_path, monkeypatch):
    """The check reads the release's vocabulary with the release's interpreter (here: this one)
    into the package's data folder, the file the installed vLLM's verdicts are named from."""
    import json
    import sys
    from pathlib import Path

    from otel_ttft.diagnosis import vocabulary_store as store

    monkeypatch.setattr(check, "VOCABULARY_DIR", tmp_path / "vllm_vocabulary")
    log = tmp_path / "log.txt"
    result = check._vocabulary(Path(sys.executable), log)
    assert result["exit"] == 0, log.read_text()[-2000:]
    written = Path(result["path"])
    assert written.parent == tmp_path / "vllm_vocabulary"
    data = json.loads(written.read_text())
    assert written.name == f"{data['vllm_version']}.json"
    assert written.stat().st_mode & 0o644 == 0o644  # readable by whoever installs the package
    if store.shipped(data["vllm_version"]) is not None:
        assert data == store.shipped(data["vllm_version"])
