"""Only vLLM's processes carry us: under ``opentelemetry-instrument`` the helpers a server starts
(multiprocessing's resource tracker, ``python -c`` probes, spawn children of programs that are not
vLLM) load our distro and the gate and nothing else of ours: no hook module, no SDK provider, no
exporter, no ``OTEL_*`` default written. A program that imports vLLM is instrumented when it does.

Real processes, run the way the server's helpers are run: the probe prints its ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_ttft.runtime import gate

INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")

# What the probe reports: which of ours and of the SDK it loaded, and the defaults it was given.
PROBE = textwrap.dedent('''
    import json, os, sys
    def report():
        mods = sorted(sys.modules)
        return {"ours": [m for m in mods if m.startswith("otel_ttft")],
                "sdk": [m for m in mods if m.startswith(("opentelemetry.sdk",
                                                          "opentelemetry.exporter"))],
                "env": {k: os.environ[k] for k in ("OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME")
                        if k in os.environ}}
''')
HEAVY = ("otel_ttft.runtime.hooks", "otel_ttft.runtime.configurator",
         "otel_ttft.runtime.instrumentor", "otel_ttft.runtime.state",
         "otel_ttft.runtime.telemetry", "opentelemetry.sdk.trace", "opentelemetry.sdk.metrics",
         "opentelemetry.exporter")


def run_instrumented(*argv: str, timeout: float = 120) -> dict:
    """``opentelemetry-instrument python ARGV`` with our distro and configurator, no ``OTEL_*``
    exporter settings of the caller's; the probe's last line, parsed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=os.getcwd(), OTEL_PYTHON_DISTRO="otel_ttft",
               OTEL_PYTHON_CONFIGURATOR="otel_ttft",
               OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",  # nothing listens: nothing sent
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    proc = subprocess.run([INSTRUMENT, sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


def assert_carries_nothing(out: dict) -> None:
    assert heavy(out["ours"] + out["sdk"]) == [], out
    assert set(out["ours"]) <= {"otel_ttft", "otel_ttft.version", "otel_ttft.runtime",
                                "otel_ttft.runtime.distro", "otel_ttft.runtime.gate"}, out
    assert out["env"] == {}, "OTEL_* defaults written outside vLLM"


def test_the_resource_tracker_form_loads_nothing_of_ours():
    """multiprocessing's resource tracker, as multiprocessing starts it (``-c`` code that imports
    its ``main``), the probe after it."""
    code = ("from multiprocessing.resource_tracker import main\n" + PROBE
            + "print(json.dumps(report()))")
    assert gate.classify(["python", "-c", code]) == gate.HELPER
    assert_carries_nothing(run_instrumented("-c", code))


def test_a_python_c_probe_loads_nothing_of_ours_until_it_imports_vllm():
    """A probe (``python -c 'import torch...'``): undecided, so only the wait for ``import
    vllm`` is set up; it never comes."""
    code = PROBE + "import email.parser\nprint(json.dumps(report()))"
    assert gate.classify(["python", "-c", code]) == gate.UNDECIDED
    assert_carries_nothing(run_instrumented("-c", code))


def test_a_spawn_child_of_a_program_that_is_not_vllm_loads_nothing_of_ours(tmp_path: Path):
    """multiprocessing's spawn children are undecided by their command line (EngineCore and the
    workers are spawn children too): one whose parent never imports vLLM stays bare."""
    script = tmp_path / "parent.py"
    script.write_text(PROBE + textwrap.dedent('''
        import multiprocessing
        if __name__ == "__main__":
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                child = pool.apply(report)
            print(json.dumps(child))
    '''))
    assert_carries_nothing(run_instrumented(str(script)))


@pytest.mark.vllm_import
def test_a_program_that_imports_vllm_is_instrumented_when_it_does():
    """``python myscript.py`` running ``LLM(...)``: its command line does not say vLLM, so the
    SDK providers, the defaults and our hooks come with ``import vllm``, before any of vLLM runs."""
    code = PROBE + textwrap.dedent('''
        before = report()
        import vllm
        from opentelemetry import trace
        from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
        after = report()
        after["provider"] = type(trace.get_tracer_provider()).__module__
        after["instrumented"] = VllmTTFTInstrumentor().is_instrumented_by_opentelemetry
        print(json.dumps({"before": before, "after": after}))
    ''')
    out = run_instrumented("-c", code, timeout=300)
    assert_carries_nothing(out["before"])
    after = out["after"]
    assert after["instrumented"] and after["provider"].startswith("opentelemetry.sdk.trace"), after
    assert "otel_ttft.runtime.hooks.registry" in after["ours"], after
    assert any(m.startswith("opentelemetry.exporter.otlp") for m in after["sdk"]), after
    assert after["env"] == {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "vllm"}, after


@pytest.mark.parametrize(("argv", "verdict"), [
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], gate.VLLM),
    (["/venv/bin/python3", "/venv/bin/vllm", "serve", "m"], gate.VLLM),
    (["python", "-X", "importtime", "-m", "vllm.snapshot.server"], gate.VLLM),
    (["python", "-um", "vllm.entrypoints.openai.api_server"], gate.VLLM),
    (["python", "-m", "vllm.model_executor.models.registry"], gate.HELPER),
    (["python", "-Wignore", "-c", "from multiprocessing.resource_tracker import main;main(5)"],
     gate.HELPER),
    (["python", "/v/site-packages/torch/_inductor/compile_worker/__main__.py", "--workers=2"],
     gate.HELPER),
    (["python", "-m", "torch._inductor.compile_worker", "--workers=2"], gate.HELPER),
    (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
      "pipe_handle=7)", "--multiprocessing-fork"], gate.UNDECIDED),
    (["python", "-c", "from multiprocessing.forkserver import main; main(3, 4, [])"],
     gate.UNDECIDED),
    (["python", "myscript.py", "-m", "vllm.x"], gate.UNDECIDED),
    (["python", "-c", "import vllm"], gate.UNDECIDED),
    (["python"], gate.UNDECIDED),
    (["python", "-m", "vllmish"], gate.UNDECIDED),
])
def test_the_command_line_decides(argv: list[str], verdict: str) -> None:
    assert gate.classify(argv) == verdict


def test_the_entry_point_modules_are_cheap_to_import():
    """What ``opentelemetry-instrument`` imports to find our distro, configurator and
    instrumentor classes loads no hook, no state, no SDK (fresh interpreter, no
    ``opentelemetry-instrument``)."""
    code = PROBE + textwrap.dedent('''
        from otel_ttft.runtime.distro import OtelTTFTConfigurator, OtelTTFTDistro
        from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
        from otel_ttft.runtime import plugin
        print(json.dumps(report()))
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert heavy(out["ours"] + out["sdk"]) == ["otel_ttft.runtime.instrumentor"], out


def test_our_distro_loads_other_instrumentors_as_the_base_distro_does():
    from otel_ttft.runtime.distro import OtelTTFTDistro

    calls = []

    class Other:
        def instrument(self, **kwargs):
            calls.append(kwargs)

    class EntryPoint:
        name, value = "other", "other_package.instrumentor:Other"

        def load(self):
            return Other

    OtelTTFTDistro().load_instrumentor(EntryPoint(), skip_dep_check=True)
    assert calls == [{"skip_dep_check": True}]
