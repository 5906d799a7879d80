"""The GPU-only paths, checked on a real NVIDIA GPU: CUDA graph capture, host-to-device copies,
sleep and wake-up, and a two-model replay through the sleep driver. No GPU here means nothing to
check: exit 2 with a message.

Part 1 starts a real vLLM (official build) on the tiny model under ``opentelemetry-instrument``
with sleep mode on, sends a request, sleeps and wakes the engine, sends another. Part 2 runs
``otel-ttft replay --driver sleep`` over both tiny models (cold-switch, switch-back, short-prompt).
Both assert on the spans the embedded receiver got. Part 0 starts the server once per model
runner (``VLLM_USE_V2_MODEL_RUNNER=1``: Model Runner V2, vLLM's GPU default; ``=0``: V1) and
asserts graph capture and KV allocation, with their numbers and the runner named, on each.
Part 3 loads through fastsafetensors (``gpu_check_load``). Part 4 (``gpu_check_verify``,
issue 19) replays, analyzes and runs ``otel-ttft verify``, which must try the changes a CPU
machine lists as "not tried here": sleep mode instead of restarts, CUDA graph capture sizes
limited to the observed batch sizes, the memory split of two resident servers. Part 5
(``gpu_check_first_use``, issue 46) checks first-use work in a ready server's steps: a prefill
outside the captured CUDA graphs named as eager, a compile on first use (Inductor's Triton
kernels for vLLM's logprobs ranks) as ``warmup.step_compile``.
Run: ``scripts/gpu-check`` (after setup).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import build_trees, coverage, find_activation_roots
from otel_ttft.tools.analysis.tree import render_tree
from otel_ttft.tools.replay.server import ServerStartError, VllmServer, telemetry_env
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore
from otel_ttft.tools.tiny_model import ensure_tiny_model
from scripts.gpu_check_first_use import run_first_use
from scripts.gpu_check_load import run_fastsafetensors
from scripts.gpu_check_verify import run_verify


def _post(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def _has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def check(spans: list[dict]) -> list[str]:
    """Problems found; empty when every GPU path produced what it should."""
    problems = []
    named = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    capture = named.get("Capture model", [])
    if not any(s["attributes"].get(semconv.ATTR_GRAPH_COUNT, 0) > 0 for s in capture):
        problems.append("no 'Capture model' span with ttft.graph.count > 0")
    if capture and capture[0]["attributes"].get(semconv.ATTR_STAGE) != \
            semconv.STAGE_WARMUP_GRAPH_CAPTURE:
        problems.append("'Capture model' is not tagged warmup.graph_capture")
    weights = named.get("Load weights", [])
    if not any(s["attributes"].get(semconv.ATTR_H2D_BYTES, 0) > 0 for s in weights):
        problems.append("no host-to-device bytes on 'Load weights'")
    if not named.get(semconv.SPAN_DEVICE_INIT):
        problems.append("no 'Init device' span")
    if not named.get(semconv.SPAN_SLEEP):
        problems.append("no 'Sleep' span")
    wakes = [r for r in find_activation_roots(spans)
             if r.attributes.get(semconv.ATTR_ACTIVATION_KIND) == "wake"]
    if not wakes:
        problems.append("no wake-up activation")
    elif not any(n.name == semconv.SPAN_WAKE_UP and n.stage == semconv.STAGE_LOAD_H2D
                 for n in wakes[0].walk()):
        problems.append("wake-up activation has no 'Wake up' [load.h2d] span")
    starts = [r for r in find_activation_roots(spans)
              if r.attributes.get(semconv.ATTR_ACTIVATION_KIND) == "start"]
    if len(starts) != 1:
        problems.append(f"expected one start activation, got {len(starts)}")
    elif coverage(starts[0]) < 0.95:
        problems.append(f"start activation coverage {coverage(starts[0]):.2f} < 0.95")
    return problems


#: VLLM_USE_V2_MODEL_RUNNER -> the runner vLLM's GPU worker then builds
RUNNERS = {"1": "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
           "0": "vllm.v1.worker.gpu_model_runner.GPUModelRunner"}


def check_runner(spans: list[dict], runner: str) -> list[str]:
    """Problems in one start under ``runner``: graph capture and KV allocation, each one span
    with its stage, its numbers and this runner named on it."""
    problems = []
    label = "V2" if ".gpu.model_runner." in runner else "V1"
    expected = {
        "Capture model": (semconv.STAGE_WARMUP_GRAPH_CAPTURE,
                          (semconv.ATTR_GRAPH_COUNT, semconv.ATTR_GRAPH_MEMORY_BYTES)),
        semconv.SPAN_KV_ALLOC: (semconv.STAGE_WARMUP_KV_ALLOC,
                                (semconv.ATTR_KV_BLOCKS, semconv.ATTR_KV_BYTES)),
    }
    for name, (stage, numbers) in expected.items():
        found = [s for s in spans if s["name"] == name
                 and s["attributes"].get(semconv.ATTR_STAGE) == stage]
        if len(found) != 1:
            problems.append(f"{label}: expected one '{name}' [{stage}] span, got {len(found)}")
            continue
        attrs = found[0]["attributes"]
        problems += [f"{label}: '{name}' has no {key} > 0" for key in numbers
                     if not attrs.get(key, 0) > 0]
        if attrs.get(semconv.ATTR_MODEL_RUNNER) != runner:
            problems.append(f"{label}: '{name}' names runner "
                            f"{attrs.get(semconv.ATTR_MODEL_RUNNER)!r}, not {runner}")
        if name == "Capture model":
            problems += _graph_modes(label, attrs)
    return problems


def _graph_modes(label: str, attrs: dict) -> list[str]:
    """vLLM's default mode on a GPU is FULL_AND_PIECEWISE: both kinds captured, counted apart,
    every CUDA graph (full graphs plus pieces) in the total."""
    full = attrs.get(semconv.ATTR_GRAPH_FULL_COUNT, 0)
    shapes = attrs.get(semconv.ATTR_GRAPH_PIECEWISE_COUNT, 0)
    pieces = attrs.get(semconv.ATTR_GRAPH_PIECEWISE_PIECES, 0)
    total = attrs.get(semconv.ATTR_GRAPH_COUNT, 0)  # (0: said above)
    if not (full > 0 and shapes > 0 and pieces >= shapes and (not total or total >= full + pieces)):
        return [f"{label}: 'Capture model' counts full {full}, piecewise {shapes} sizes in "
                f"{pieces} pieces, {attrs.get(semconv.ATTR_GRAPH_COUNT)} CUDA graphs: want "
                f"both modes, pieces >= sizes, the total their sum"]
    return []


def each_runner(model: Path, out: Path, timeout: float) -> list[str]:
    """Part 0: one traced start and one request per model runner."""
    problems = []
    for flag, runner in RUNNERS.items():
        (out / f"v2={flag}").mkdir(parents=True, exist_ok=True)
        store = SpanStore(out / f"v2={flag}")
        with OTLPReceiver(store) as receiver:
            env = {**telemetry_env(receiver.http_endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200",
                   "VLLM_USE_V2_MODEL_RUNNER": flag}
            server = VllmServer(model, env=env, log_path=out / f"vllm-server-v2={flag}.log",
                                extra_args=("--gpu-memory-utilization", "0.3"))
            server.start(timeout_s=timeout)
            try:
                _post(f"{server.url}/v1/completions",
                      {"model": str(model), "prompt": "hello", "max_tokens": 4})
            finally:
                server.stop()
            with contextlib.suppress(TimeoutError):
                receiver.wait_for_spans(lambda s, r=runner: not check_runner(s, r), timeout=30)
        found = check_runner(store.spans(), runner)
        for span in store.spans():
            if span["name"] in ("Capture model", semconv.SPAN_KV_ALLOC):
                numbers = {k: v for k, v in span["attributes"].items()
                           if k.startswith(("ttft.graph.", "ttft.kv."))}
                print(f"gpu-check: VLLM_USE_V2_MODEL_RUNNER={flag}: {span['name']} {numbers}")
        problems += found
    return problems


REPLAY_SCENARIOS = ("cold-switch", "switch-back", "short-prompt")


def check_sleep_replay(spans: list[dict]) -> list[str]:
    """Problems in the sleep-driver replay's spans; empty when the switch was traced end to end."""
    problems = []
    named: dict[str, list[dict]] = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    requests = named.get(semconv.SPAN_REPLAY_REQUEST, [])
    if sorted(r["attributes"].get(semconv.ATTR_REPLAY_SCENARIO) for r in requests) != \
            sorted(REPLAY_SCENARIOS):
        problems.append(f"replay: expected one replay.request per scenario, got {len(requests)}")
    parents = {s["parent_span_id"] for s in named.get(semconv.SPAN_REQUEST, [])}
    if any(r["span_id"] not in parents for r in requests):
        problems.append("replay: a replay.request has no llm_request child (traceparent lost)")
    if any(r["attributes"].get(semconv.ATTR_REPLAY_ERROR) for r in requests):
        problems.append("replay: a request failed")
    sleeps = [s for s in named.get(semconv.SPAN_SWITCH, [])
              if s["attributes"].get(semconv.ATTR_SWITCH_REASON) == semconv.SWITCH_REASON_SLEEP]
    if len(sleeps) < 2:
        problems.append(f"replay: expected >= 2 vllm.switch spans for sleep, got {len(sleeps)}")
    sleep_ids = {s["span_id"] for s in sleeps}
    if not any(s["parent_span_id"] in sleep_ids for s in named.get(semconv.SPAN_SLEEP, [])):
        problems.append("replay: EngineCore's Sleep is not under the API's vllm.switch")
    wakes = [r for r in find_activation_roots(spans)
             if r.attributes.get(semconv.ATTR_ACTIVATION_KIND) == "wake"]
    if len(wakes) < 2:
        problems.append(f"replay: expected >= 2 wake activations, got {len(wakes)}")
    return problems


def replay_with_sleep_driver(out: Path, timeout: float) -> list[str]:
    """Part 2: both tiny models under the sleep driver, into a receiver of its own."""
    from otel_ttft.tools.replay.command import run_argv

    store = SpanStore(out)
    with OTLPReceiver(store) as receiver:
        rc = run_argv(["--driver", "sleep", "--scenarios", ",".join(REPLAY_SCENARIOS),
                       "--otlp-endpoint", receiver.http_endpoint, "--out", str(out),
                       "--start-timeout", str(timeout)])
        with contextlib.suppress(TimeoutError):
            receiver.wait_for_spans(lambda s: not check_sleep_replay(s), timeout=30)
    problems = [] if rc == 0 else [f"replay: otel-ttft replay --driver sleep exited {rc}"]
    return problems + check_sleep_replay(store.spans())


def sleep_and_wake(model: Path, out: Path, timeout: float) -> list[str]:
    """Part 1: one traced server with sleep mode; a request, sleep, wake-up, a request."""
    store = SpanStore(out)
    with OTLPReceiver(store) as receiver:
        env = {**telemetry_env(receiver.http_endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200",
               "VLLM_SERVER_DEV_MODE": "1"}
        server = VllmServer(model, env=env, log_path=out / "vllm-server.log",
                            extra_args=("--enable-sleep-mode", "--gpu-memory-utilization", "0.3"))
        server.start(timeout_s=timeout)
        try:
            body = {"model": str(model), "prompt": "hello", "max_tokens": 4}
            _post(f"{server.url}/v1/completions", body)
            _post(f"{server.url}/sleep?level=1")
            _post(f"{server.url}/wake_up")
            _post(f"{server.url}/v1/completions", body)
        finally:
            server.stop()
        with contextlib.suppress(TimeoutError):  # report what did arrive
            receiver.wait_for_spans(lambda s: not check(s), timeout=30)
    spans = store.spans()
    for roots in build_trees(spans).values():
        for root in roots:
            if root.name == semconv.SPAN_ACTIVATION:
                print(render_tree(root))
    return check(spans)


def guarded(part: str, run: Callable[[], list[str]]) -> list[str]:
    """A part's problems; a server that did not start or answer is one problem, not a traceback
    (its log is in the part's folder)."""
    try:
        return run()
    except (ServerStartError, OSError) as exc:  # URLError and HTTPError are OSErrors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return [f"{part}: {type(exc).__name__}: {first}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out/gpu-check"))
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if not _has_gpu():
        print("gpu-check: no NVIDIA GPU (nvidia-smi -L failed); nothing to check", file=sys.stderr)
        return 2
    model = ensure_tiny_model()
    args.out.mkdir(parents=True, exist_ok=True)
    problems = guarded("runners", lambda: each_runner(model, args.out / "runners",
                                                      args.timeout))  # issue 45
    problems += guarded("sleep/wake", lambda: sleep_and_wake(model, args.out, args.timeout))
    problems += guarded("replay", lambda: replay_with_sleep_driver(args.out / "replay",
                                                                   args.timeout))
    problems += guarded("fastsafetensors", lambda: run_fastsafetensors(  # issue 10
        model, args.out / "fastsafetensors", args.timeout))
    problems += guarded("verify", lambda: run_verify(args.out / "verify", args.timeout))  # 19
    problems += guarded("first-use", lambda: run_first_use(  # issue 46
        model, args.out / "first-use", args.timeout))
    for problem in problems:
        print(f"gpu-check: FAIL {problem}", file=sys.stderr)
    print(f"gpu-check: {'FAILED' if problems else 'passed'}; data in {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
