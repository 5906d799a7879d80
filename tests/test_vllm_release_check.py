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
