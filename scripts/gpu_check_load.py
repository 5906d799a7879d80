"""gpu-check's load-format part (issue 10): a real vLLM loading the tiny model with
``--load-format fastsafetensors`` (GPUDirect where the machine has it, else its bounce buffer),
whose per-file read spans must add up to the checkpoint on disk."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

from otel_ttft import semconv
from otel_ttft.tools.replay.server import VllmServer, telemetry_env
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import checkpoint_files


def check_fastsafetensors(spans: list[dict], model: Path) -> list[str]:
    """Problems with the fastsafetensors shard spans; empty when they are right."""
    shards = [s for s in spans if s["name"] == semconv.SPAN_SHARD_READ
              and s["attributes"].get(semconv.ATTR_LOAD_READER) == "fastsafetensors"]
    files = checkpoint_files(model)
    if len(shards) != len(files):
        return [f"fastsafetensors: {len(shards)} shard spans for {len(files)} files"]
    got = sum(s["attributes"].get(semconv.ATTR_SHARD_BYTES, 0) for s in shards)
    want = sum(f.stat().st_size for f in files)
    problems = [] if got == want else [f"fastsafetensors: shards sum to {got} B, not {want} B"]
    weights = [s for s in spans if s["name"] == semconv.SPAN_LOAD_WEIGHTS]
    if not any(s["attributes"].get(semconv.ATTR_LOAD_READ_UNION_SECONDS, 0) > 0 for s in weights):
        problems.append("fastsafetensors: no union read seconds on 'Load weights'")
    return problems


def run_fastsafetensors(model: Path, out: Path, timeout_s: float) -> list[str]:
    if importlib.util.find_spec("fastsafetensors") is None:
        return ["fastsafetensors is not installed (scripts/setup installs it on CUDA machines)"]
    out.mkdir(parents=True, exist_ok=True)
    store = SpanStore(out)
    with OTLPReceiver(store) as receiver:
        env = {**telemetry_env(receiver.http_endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200"}
        server = VllmServer(model, env=env, log_path=out / "vllm-server.log",
                            extra_args=("--load-format", "fastsafetensors",
                                        "--gpu-memory-utilization", "0.3"))
        server.start(timeout_s=timeout_s)
        server.stop()
        with contextlib.suppress(TimeoutError):
            receiver.wait_for_spans(lambda s: not check_fastsafetensors(s, model), timeout=30)
    return check_fastsafetensors(store.spans(), model)
