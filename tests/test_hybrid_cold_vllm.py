"""A real vLLM (CPU build) on the tiny hybrid model (one sliding-window and one full-attention
layer), loaded from an evicted checkpoint with 1 GiB of KV cache, then again warm (issue 55).

One offline vLLM process (no API server) builds the engine twice; spans go over OTLP/HTTP to the
project's receiver. Compared with what vLLM itself says and holds: its "KV cache size: N tokens"
log line, its scheduler's KV-cache groups, and the bytes of the KV tensors the worker holds
(each storage once, read through vLLM's public ``LLM.collective_rpc``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import build_trees
from otel_ttft.tools.tiny_model import checkpoint_files, ensure_tiny_hybrid_model

pytestmark = pytest.mark.vllm

GIB = 1 << 30
SCRIPT = r"""
import json, os, secrets, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from opentelemetry import context as otel_context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter


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


def allocated(worker):  # the KV tensors this worker holds, each storage once
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in worker.model_runner.kv_caches}
    return sum(storages.values())


model = sys.argv[2]
for run in ("cold", "warm"):
    if run == "cold":
        for path in os.listdir(model):
            pagecache.evict(os.path.join(model, path))
        print("RESIDENT", json.dumps([pagecache.resident_ratio(os.path.join(model, p))
                                      for p in sorted(os.listdir(model))
                                      if p.endswith(".safetensors")]), flush=True)
    for key in ("traceparent", "tracestate"):
        os.environ.pop(key, None)
    with trace.get_tracer("test").start_as_current_span("run " + run,
                                                        context=otel_context.Context()):
        llm = LLM(model=model, enforce_eager=True, dtype="float32", max_model_len=2048,
                  max_num_batched_tokens=256, kv_cache_memory_bytes=1 << 30)
    core = llm.llm_engine.engine_core.engine_core
    config = core.scheduler.kv_cache_manager.kv_cache_config
    print("VLLM", run, json.dumps({
        "groups": [type(g.kv_cache_spec).__name__ for g in config.kv_cache_groups],
        "num_blocks": config.num_blocks,
        "tokens": llm.llm_engine.vllm_config.cache_config.kv_cache_size_tokens,
        "allocated": llm.collective_rpc(allocated)}), flush=True)
    del llm, core
    import gc; gc.collect()
provider.shutdown()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from otel_ttft.tools.sink.receiver import OTLPReceiver
    from otel_ttft.tools.sink.store import SpanStore

    tmp = tmp_path_factory.mktemp("hybrid")
    model = tmp / "model"  # a private copy: nobody else reads it between eviction and load
    shutil.copytree(ensure_tiny_hybrid_model(), model)
    rx = OTLPReceiver(SpanStore(tmp / "store"))
    rx.start()
    try:
        script = tmp / "hybrid.py"
        script.write_text(SCRIPT)
        env = {**os.environ, "OTEL_SDK_DISABLED": "false", "VLLM_LOGGING_LEVEL": "INFO"}
        proc = subprocess.run([sys.executable, str(script), f"{rx.http_endpoint}/v1/traces",
                               str(model)], capture_output=True, text=True, timeout=900,
                              env=env)
        said = {line.split()[1]: json.loads(line.split(None, 2)[2])
                for line in proc.stdout.splitlines() if line.startswith("VLLM ")}
        assert set(said) == {"cold", "warm"}, proc.stdout[-2000:] + proc.stderr[-4000:]
        resident = next(json.loads(line.split(None, 1)[1]) for line in proc.stdout.splitlines()
                        if line.startswith("RESIDENT "))
        spans = rx.store.spans()
    finally:
        rx.stop()
    trees = {root.name[4:]: root for roots in build_trees(spans).values() for root in roots
             if root.name.startswith("run ")}
    logged = [int(m.replace(",", "")) for m in re.findall(r"KV cache size: ([\d,]+) tokens",
                                                            proc.stdout + proc.stderr)]
    return {"said": said, "trees": trees, "logged": logged, "model": model,
            "resident_before": resident}


def _find(root, name):
    return [n for n in root.walk() if n.name == name]


@pytest.mark.parametrize("run", ["cold", "warm"])
def test_kv_bytes_and_tokens_are_what_vllm_allocated_and_says(runs, run):
    said = runs["said"][run]
    assert said["groups"] == ["SlidingWindowSpec", "FullAttentionSpec"]  # a hybrid: two groups
    assert said["allocated"] == [GIB]  # one worker, one shared buffer of 1 GiB
    assert said["tokens"] in runs["logged"]  # the figure vLLM logged
    (kv,) = _find(runs["trees"][run], semconv.SPAN_KV_ALLOC)
    a = kv.attributes
    assert a[semconv.ATTR_KV_BYTES] == said["allocated"][0]
    assert a[semconv.ATTR_KV_TOKEN_CAPACITY] == said["tokens"]
    assert a[semconv.ATTR_KV_BLOCKS] == said["num_blocks"]
    assert a[semconv.ATTR_KV_GROUPS] == 2
    assert a[semconv.ATTR_KV_GROUP_SPECS] == said["groups"]
    assert a[semconv.ATTR_KV_SEQUENCE_GROUPS] == 1 and a[semconv.ATTR_KV_WINDOW_BLOCKS] > 0


def test_a_cold_loads_storage_reads_are_the_read_stage(runs):
    assert runs["resident_before"] and set(runs["resident_before"]) == {0.0}
    files = checkpoint_files(runs["model"])
    on_disk = sum(f.stat().st_size for f in files)
    for run, cold in (("cold", True), ("warm", False)):
        (weights,) = _find(runs["trees"][run], semconv.SPAN_LOAD_WEIGHTS)
        shards = _find(weights, semconv.SPAN_SHARD_READ)
        assert len(shards) == len(files)
        faulted = sum(s.attributes[semconv.ATTR_LOAD_FAULTED_BYTES] for s in shards)
        for s in shards:
            a = s.attributes
            assert a[semconv.ATTR_PAGE_CACHE_RESIDENT_AFTER] == 1.0
            assert (a[semconv.ATTR_PAGE_CACHE_RESIDENT] == 0.0) is cold
            # only what was not cached can be read: (machines beside this test may evict a
            # few pages of a warm file between the two loads)
            uncached = (1 - a[semconv.ATTR_PAGE_CACHE_RESIDENT]) * a[semconv.ATTR_SHARD_BYTES]
            assert a[semconv.ATTR_LOAD_FAULTED_BYTES] <= uncached + 4096 * a[
                semconv.ATTR_SHARD_TENSORS]
        if cold:  # the pages readahead did not bring were read inside the read stage
            assert 0 < faulted < on_disk
        else:
            assert faulted < 0.01 * on_disk
        w = weights.attributes
        assert w[semconv.ATTR_LOAD_FAULTED_BYTES] == faulted
        assert w[semconv.ATTR_LOAD_COPY_SECONDS] > 0
