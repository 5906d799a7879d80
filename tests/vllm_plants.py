"""Causes a test makes inside a real vLLM: general plugins (``vllm.general_plugins`` entry points,
loaded in every vLLM process) put on one server's ``PYTHONPATH`` through its command template.

A planted delay is scaled to the machine (``TTFT_TEST_FACTOR``), so that on a quiet or a loaded
machine alike the planted step outweighs the three processes' imports, as a large model's would:

- ``compile``: Inductor's real code generation (``fx_codegen_and_compile``) takes FACTOR times
  longer than it did, every time: the tiny model's compile made as heavy as a large model's. A
  kept cache helps it exactly as much as it helps the real one (with torch 2.13 the FX graph
  cache never hits across processes, the kernels' code cache does: codegen 24 s -> 8.5 s here).
- ``read``: vLLM's safetensors iterator, after the first tensor of its first shard, sleeps FACTOR
  times the process's age (inside that shard's read span): a checkpoint read from slow storage.
- ``rank1_load``: in the worker of rank 1 only (vLLM names its process ``VllmWorker-1``), vLLM's
  weight loading (``DefaultModelLoader.get_all_weights``, inside its "Load weights" span) sleeps
  FACTOR times the process's age first: one rank whose checkpoint reads were slow.
- ``rank1_device``: in the worker of rank 1 only, vLLM's CPU device init (where
  ``CPUWorker.init_device`` asks the platform for its CPU architecture, before vLLM's distributed
  rendezvous) sleeps FACTOR times the process's age: one rank whose device was slow to come up,
  the other waiting for it at the rendezvous.
- ``rank1_kv``: in the worker of rank 1 only, the CPU model runner's KV-cache allocation
  (``CPUModelRunner.initialize_kv_cache``, inside vLLM's "Allocate KV cache") sleeps FACTOR
  times the process's age first.
- ``profile``: vLLM's CPU memory probe, where the profile run calls it, sleeps FACTOR times the
  process's age (its interpreter start and imports), whatever the settings: a start-up cost no
  vLLM setting removes.
"""

from __future__ import annotations

import shlex
from pathlib import Path

_COMMON = '''
import os, time


def _age():
    """Seconds since exec, on the monotonic clock (a wall-clock step would inflate it)."""
    from otel_ttft.runtime import clock

    return time.monotonic() - clock.process_start_monotonic()


def _slow(inner, caller):
    """``inner`` sleeping FACTOR x the process's age, once, when ``caller`` calls it."""
    import sys

    factor = float(os.environ["TTFT_TEST_FACTOR"])
    done = []

    def slow(*args, **kwargs):
        if not done and sys._getframe(1).f_code.co_name == caller:
            done.append(True)
            time.sleep(factor * _age())
        return inner(*args, **kwargs)
    return slow
'''

PLANTS = {
    "compile": _COMMON + '''

def _heavier(inner):
    factor = float(os.environ["TTFT_TEST_FACTOR"])

    def heavier(*args, **kwargs):
        start = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            time.sleep(factor * (time.monotonic() - start))
    return heavier


def register():
    import torch._inductor.compile_fx as cfx

    if not getattr(cfx, "_ttft_test_planted", False):
        cfx._ttft_test_planted = True
        cfx.fx_codegen_and_compile = _heavier(cfx.fx_codegen_and_compile)
''',
    "read": _COMMON + '''

def _slow_iterator(inner):
    factor = float(os.environ["TTFT_TEST_FACTOR"])
    done = []

    def slow(*args, **kwargs):
        for item in inner(*args, **kwargs):
            if not done:
                done.append(True)
                time.sleep(factor * _age())
            yield item
    return slow


def register():
    try:
        from vllm.model_executor.model_loader import default_loader
    except ImportError:
        return
    if not getattr(default_loader, "_ttft_test_planted", False):
        # the default loader's own name for it (what otel-ttft's shard hook wraps too): wrapped,
        # never replaced, whichever of the two comes first
        default_loader._ttft_test_planted = True
        default_loader.safetensors_weights_iterator = _slow_iterator(
            default_loader.safetensors_weights_iterator)
''',
    "profile": _COMMON + '''

def register():
    try:
        from vllm.v1.worker import cpu_worker
    except ImportError:
        return
    if not getattr(cpu_worker, "_ttft_test_planted", False):
        cpu_worker._ttft_test_planted = True
        cpu_worker.get_memory_node_info = _slow(cpu_worker.get_memory_node_info,
                                                "determine_available_memory")
''',
    "rank1_load": _COMMON + '''

def register():
    import multiprocessing

    if multiprocessing.current_process().name != "VllmWorker-1":
        return
    from vllm.model_executor.model_loader import default_loader as dl

    if getattr(dl, "_ttft_test_planted", False):
        return
    dl._ttft_test_planted = True
    inner = dl.DefaultModelLoader.get_all_weights
    factor = float(os.environ["TTFT_TEST_FACTOR"])

    def get_all_weights(*args, **kwargs):
        time.sleep(factor * _age())
        return inner(*args, **kwargs)
    dl.DefaultModelLoader.get_all_weights = get_all_weights
''',
    "rank1_device": _COMMON + '''

def register():
    import multiprocessing

    if multiprocessing.current_process().name != "VllmWorker-1":
        return
    from vllm.platforms import current_platform

    if getattr(current_platform, "_ttft_test_planted", False):
        return
    current_platform._ttft_test_planted = True
    current_platform.get_cpu_architecture = _slow(current_platform.get_cpu_architecture,
                                                  "init_device")
''',
    "rank1_kv": _COMMON + '''

def register():
    import multiprocessing

    if multiprocessing.current_process().name != "VllmWorker-1":
        return
    from vllm.v1.worker import cpu_model_runner as cmr

    runner = cmr.CPUModelRunner
    if getattr(runner, "_ttft_test_planted", False):
        return
    runner._ttft_test_planted = True
    inner = runner.initialize_kv_cache
    factor = float(os.environ["TTFT_TEST_FACTOR"])

    def initialize_kv_cache(self, *args, **kwargs):
        time.sleep(factor * _age())
        return inner(self, *args, **kwargs)
    runner.initialize_kv_cache = initialize_kv_cache
''',
}


def plugin_dir(tmp_path: Path, plant: str) -> Path:
    """A directory holding the plant as an installed distribution with its entry point."""
    name = f"ttft_test_{plant}"
    root = tmp_path / name
    dist = root / f"{name}-0.0.dist-info"
    dist.mkdir(parents=True)
    (root / f"{name}.py").write_text(PLANTS[plant])
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{name} = {name}:register\n")
    return root


def planted(template: str, tmp_path: Path, plant: str, factor: float = 3.0) -> str:
    """``template`` run with the plant on its PYTHONPATH."""
    root = shlex.quote(str(plugin_dir(tmp_path, plant)))
    return f"env PYTHONPATH={root} TTFT_TEST_FACTOR={factor} " + template
