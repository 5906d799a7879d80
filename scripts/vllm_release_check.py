"""A new vLLM release against otel-ttft, without a GPU: the official ``vllm==VERSION`` wheel in a
throwaway venv, then ``otel-ttft doctor`` (this host, ``--device cuda`` with each runner) and the
``vllm_import`` tests that use vLLM's real classes without starting an engine.

What it installs: vLLM's wheel with ``--no-deps``, then vLLM's own requirements (its wheel
metadata) but the GPU kernel packages (CUDA-only, several GB, never imported by a check that
starts no engine), and a torch of vLLM's pinned minor (``--torch``: the pin by default; where
pip is capped, a release of the same minor that lies on disk). So it checks targets,
signatures and vLLM's runner choice; nothing that needs CUDA kernels (``scripts/gpu-check``).
It also reads the release's vocabulary (its server flags, environment variables, routes: what the
verdict's changes are named with) into ``otel_ttft/diagnosis/vllm_vocabulary/VERSION.json``, the
data the package ships so that no server reads vLLM's parser or source: commit that file.
Run it for each new release: ``scripts/vllm-release-check 0.33.0``. Exit 0 when doctor finds
every required target, the vocabulary is read and the tests pass; the result is also written to
``out/vllm-release-check/VERSION/result.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: CUDA kernel and media packages vLLM requires for serving on a GPU, not for importing its
#: classes; leaving them out keeps the check to a CPU machine's disk and minutes
GPU_ONLY = re.compile(r"^(nvidia-.*|flashinfer.*|tilelang|quack-kernels|tokenspeed-mla|"
                      r"humming-kernels|pynvvideocodec|apache-tvm-ffi|torchaudio|torchvision|"
                      r"torchcodec|fastsafetensors|instanttensor|zentorch|deep[-_]gemm.*)$", re.I)
#: the tests that use vLLM's real classes and start no engine, and hold on any host
TESTS = ("tests/test_model_runners.py", "tests/test_gpu_paths.py", "tests/test_request_vllm033.py")
#: where the package keeps each release's vocabulary (``otel_ttft.tools.vllm_vocabulary``)
VOCABULARY_DIR = ROOT / "otel_ttft" / "diagnosis" / "vllm_vocabulary"


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None,
         timeout: float = 3600) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\nexit {proc.returncode}\n")
    return proc


def _requirements(python: str, log: Path, torch: str) -> list[str]:
    """vLLM's own requirements for this interpreter, GPU-only packages left out, torch as asked."""
    probe = ("import importlib.metadata as m, json; from packaging.requirements import Requirement;"
             "rs = [Requirement(r) for r in m.requires('vllm') or ()];"
             "print(json.dumps([str(r) for r in rs if r.marker is None or "
             "r.marker.evaluate({'extra': ''})]))")
    proc = _run([python, "-c", probe], log)
    if proc.returncode != 0:
        raise SystemExit(f"vllm-release-check: cannot read vLLM's requirements (see {log})")
    keep = []
    for text in json.loads(proc.stdout):
        name = re.split(r"[\s<>=!~;\[(]", text, maxsplit=1)[0]
        if GPU_ONLY.match(name):
            continue
        keep.append(f"torch=={torch}" if name.lower() == "torch" else text.split(";")[0])
    return keep


def _pinned_torch(python: str, log: Path) -> str | None:
    probe = ("import importlib.metadata as m, re;"
             "print(next((re.sub(r'^torch\\s*==\\s*', '', r.split(';')[0]).strip() "
             "for r in m.requires('vllm') or () if re.match(r'torch\\s*==', r)), ''))")
    proc = _run([python, "-c", probe], log)
    return proc.stdout.strip() or None


def _setup(version: str, venv: Path, torch: str | None, log: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists() and _run([sys.executable, "-m", "venv", str(venv)],
                                    log).returncode != 0:
        raise SystemExit(f"vllm-release-check: cannot create {venv} (see {log})")
    pip = [str(python), "-m", "pip", "install", "-q"]
    if _run([*pip, "packaging", f"vllm=={version}", "--no-deps"], log).returncode != 0:
        raise SystemExit(f"vllm-release-check: vllm=={version} did not install (see {log})")
    torch = torch or _pinned_torch(str(python), log)
    requirements = _requirements(str(python), log, torch or "")
    if _run([*pip, *requirements], log).returncode != 0:
        raise SystemExit(f"vllm-release-check: vLLM's requirements did not install (see {log})")
    if _run([*pip, f"{ROOT}[test]"], log).returncode != 0:
        raise SystemExit(f"vllm-release-check: otel-ttft did not install (see {log})")
    return python


def _doctor(python: Path, log: Path, *args: str) -> dict:
    proc = _run([str(python), "-m", "otel_ttft.tools.doctor", "--json", *args], log,
                env={"PYTHONPATH": str(ROOT)})
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}
    hooks = report["hooks"]
    choice = report.get("model_runner") or {}
    return {"exit": proc.returncode, "vllm": report["vllm"]["module_version"],
            "supported": report["vllm"]["supported"],
            "resolved": sum(h["resolved"] for h in hooks), "hooks": len(hooks),
            "missing": [h["target"] for h in hooks if not h["resolved"] and not h["optional"]],
            "runner": choice.get("runner"), "reason": choice.get("reason"),
            "stages": {r["stage"]: r["status"] for r in choice.get("stages", [])}}


def _vocabulary(python: Path, log: Path) -> dict:
    """The release's vocabulary, read by its own interpreter into the package's data."""
    proc = _run([str(python), "-m", "otel_ttft.tools.vllm_vocabulary", "--write",
                 str(VOCABULARY_DIR)], log, env={"PYTHONPATH": str(ROOT),
                                                "VLLM_LOGGING_LEVEL": "ERROR"})
    lines = proc.stdout.strip().splitlines()
    return {"exit": proc.returncode, "path": lines[-1] if proc.returncode == 0 and lines else None,
            "error": None if proc.returncode == 0 else
            (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-release-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", help="the vLLM release, e.g. 0.33.0")
    parser.add_argument("--torch", help="torch version to install (default: vLLM's pin)")
    parser.add_argument("--venv", type=Path, help="default: /tmp/otel-ttft-vllm-VERSION")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "vllm-release-check")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z0-9.+-]*)", args.version):
        parser.error(f"not a version: {args.version!r}")
    venv = args.venv or Path(tempfile.gettempdir()) / f"otel-ttft-vllm-{args.version}"
    out = args.out / args.version
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    log.write_text("")
    python = _setup(args.version, venv, args.torch, log)
    result = {"vllm": args.version, "date": datetime.date.today().isoformat(), "venv": str(venv),
              "torch": _run([str(python), "-c", "import torch; print(torch.__version__)"],
                            log).stdout.strip(),
              "doctor": {"host": _doctor(python, log),
                         "cuda": _doctor(python, log, "--device", "cuda"),
                         "cuda V1": _doctor(python, log, "--device", "cuda", "--env",
                                            "VLLM_USE_V2_MODEL_RUNNER=0")},
              "vocabulary": _vocabulary(python, log)}
    tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                  "vllm_import", *TESTS], log, env={"PYTHONPATH": str(ROOT), "CI": "1"})
    result["tests"] = {"exit": tests.returncode,
                       "summary": (tests.stdout.strip().splitlines() or [""])[-1]}
    failed = [line for line in tests.stdout.splitlines() if line.startswith("FAILED")]
    result["tests"]["failed"] = failed
    ok = (tests.returncode == 0 and result["vocabulary"]["exit"] == 0
          and all(d.get("exit") == 0 and not d.get("missing")
                  for d in result["doctor"].values()))
    result["passed"] = ok
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out / "result.json")
    print(json.dumps(result, indent=2))
    print(f"vllm-release-check: {'passed' if ok else 'FAILED'} for vllm {args.version}; "
          f"log in {log}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
