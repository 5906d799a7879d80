"""The container recipe (deploy/): the Dockerfile layers otel-ttft on a vLLM image in our
supported range with the entry point the docs show, the compose file passes ``docker-compose
config`` (alone and beside the stack's), keeps the verdict's history on a named volume and
publishes on loopback only, and doctor's fix is what it mounts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from otel_ttft.runtime import history_storage
from otel_ttft.runtime.vllm_version import SUPPORTED

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yaml"
STACK = ROOT / "collector-config" / "docker-compose.yaml"
ENTRYPOINT = ["opentelemetry-instrument", "python3", "-m", "vllm.entrypoints.openai.api_server"]
HISTORY = "/var/lib/otel-ttft/activations.json"
IN_CI = bool(os.environ.get("CI"))
NO_COMPOSE = pytest.mark.skipif(shutil.which("docker-compose") is None and not IN_CI,
                                reason="docker-compose not installed (scripts/setup installs it)")


def _instructions() -> list[str]:
    """The Dockerfile's instructions, one a string, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _one(keyword: str) -> list[str]:
    return [i for i in _instructions() if i.split(None, 1)[0].upper() == keyword]


def _section() -> str:
    page = (ROOT / "docs" / "production.md").read_text()
    return page.split("## In a container", 1)[1]


def test_dockerfile_layers_on_a_supported_vllm_image():
    (arg,) = [i for i in _one("ARG") if i.startswith("ARG VLLM_IMAGE=")]
    image = arg.split("=", 1)[1]
    name, tag = image.split(":")
    assert name == "vllm/vllm-openai"
    assert Version(tag.lstrip("v")) in SpecifierSet(SUPPORTED), (tag, SUPPORTED)
    assert _one("FROM") == ["FROM ${VLLM_IMAGE}"]
    assert f"`{image}`" in _section()


def test_dockerfile_entrypoint_copy_and_history_are_what_the_docs_show():
    (entrypoint,) = _one("ENTRYPOINT")
    assert json.loads(entrypoint.split(None, 1)[1]) == ENTRYPOINT
    (copy,) = _one("COPY")
    assert copy == "COPY dist/otel_ttft-*.whl /tmp/otel-ttft/"
    (env,) = _one("ENV")
    assert env == f"ENV OTEL_TTFT_VERDICT_HISTORY={HISTORY}"
    assert not _one("VOLUME"), "an anonymous volume dies with its container: leave it to the user"
    (install,) = [i for i in _one("RUN") if "otel_ttft-" in i]
    assert "/tmp/otel-ttft/otel_ttft-*.whl" in install
    section = _section()
    for line in (entrypoint, copy, env):
        assert f"\n{line}\n" in section, f"docs/production.md does not show {line!r}"


def test_build_context_is_the_wheel_only():
    lines = [x for x in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
             if x and not x.startswith("#")]
    assert lines == ["*", "!dist/otel_ttft-*.whl"]


def _vllm_service() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]["vllm"]


def test_compose_keeps_the_history_and_caches_on_named_volumes():
    compose = yaml.safe_load(COMPOSE.read_text())
    svc = compose["services"]["vllm"]
    mounts = dict(v.split("#")[0].strip().split(":")[:2] for v in svc["volumes"])
    assert set(mounts) <= set(compose["volumes"]), "every volume is a named one"
    history_dir = os.path.dirname(svc["environment"]["OTEL_TTFT_VERDICT_HISTORY"])
    assert svc["environment"]["OTEL_TTFT_VERDICT_HISTORY"] == HISTORY
    assert mounts["ttft-history"] == history_dir == history_storage.VOLUME_DIR
    assert mounts["vllm-cache"] == "/root/.cache/vllm"
    assert mounts["hf-cache"] == "/root/.cache/huggingface"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in svc["environment"]
    build = svc["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def test_doctor_fix_is_what_compose_mounts():
    svc = _vllm_service()
    wanted = (f"-v ttft-history:{history_storage.VOLUME_DIR} "
              f"-e OTEL_TTFT_VERDICT_HISTORY={svc['environment']['OTEL_TTFT_VERDICT_HISTORY']}")
    assert wanted == history_storage.FIX
    assert history_storage.FIX in _section()


def test_compose_publishes_on_loopback_only():
    svc = _vllm_service()
    assert svc.get("network_mode") != "host"
    assert svc["ports"] and all(
        re.fullmatch(r"127\.0\.0\.1:\d+:\d+(/(tcp|udp))?", str(p)) for p in svc["ports"])


def _compose_config(*files: Path) -> subprocess.CompletedProcess:
    args = ["docker-compose", "-p", "otel-ttft"]
    for f in files:
        args += ["-f", str(f)]
    return subprocess.run([*args, "config"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "MODEL": "some/model"})


@NO_COMPOSE
def test_compose_file_passes_docker_compose_config():
    out = _compose_config(COMPOSE)
    assert out.returncode == 0, out.stdout + out.stderr
    svc = yaml.safe_load(out.stdout)["services"]["vllm"]
    assert svc["command"] == ["--model", "some/model"]
    assert Path(svc["build"]["context"]) == ROOT


@NO_COMPOSE
def test_compose_beside_the_stack_sends_to_its_collector():
    out = _compose_config(STACK, COMPOSE)
    assert out.returncode == 0, out.stdout + out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert "otel-collector" in services
    env = services["vllm"]["environment"]
    if "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ:
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert Path(services["vllm"]["build"]["context"]) == ROOT  # paths from the first file's dir


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(os.environ.get("OTEL_TTFT_DOCKER_BUILD") != "1",
                    reason="pulls vLLM's image (gigabytes): set OTEL_TTFT_DOCKER_BUILD=1 on a "
                           "host with a Docker engine and a wheel in dist/")
def test_image_builds_and_has_otel_ttft():
    assert _docker_engine(), "no Docker engine"
    wheels = sorted((ROOT / "dist").glob("otel_ttft-*.whl"))
    assert len(wheels) == 1, f"one wheel in dist/, found {wheels}"
    build = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t",
                            "vllm-otel-ttft:test", str(ROOT)], capture_output=True, text=True,
                           timeout=3600)
    assert build.returncode == 0, build.stderr[-4000:]
    inspect = subprocess.run(["docker", "image", "inspect", "-f", "{{json .Config.Entrypoint}}",
                              "vllm-otel-ttft:test"], capture_output=True, text=True, timeout=60)
    assert json.loads(inspect.stdout) == ENTRYPOINT
    doctor = subprocess.run(["docker", "run", "--rm", "--entrypoint", "otel-ttft",
                             "vllm-otel-ttft:test", "doctor", "--device", "cuda"],
                            capture_output=True, text=True, timeout=600)
    assert f"verdict history: {HISTORY}" in doctor.stdout, doctor.stdout + doctor.stderr
    assert "WARNING" in doctor.stdout  # no volume mounted: the container's own file system
