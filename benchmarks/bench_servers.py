"""The end-to-end benchmarks' servers: one vLLM API server per arm (``plain`` vLLM, ``sdk``:
``opentelemetry-instrument`` with the SDK and exporters but our instrumentor off, ``ours``), each
exporting over OTLP/HTTP to a receiver in the benchmark's process; their placement on the CPUs,
start-up with a discarded warm-up, and the run-time switches of ``api_probe.py``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from bench_load import run
from server_counters import pause, pin, processes, thread_names

from otel_ttft.tools.replay.server import VllmServer

EXPORT_ENV = {
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_METRICS_EXPORTER": "otlp",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_SERVICE_NAME": "vllm-bench",
}  # the SDK's batching defaults: what a user gets
ARMS = ("plain", "sdk", "ours")
ARM_ENV = {
    "plain": {"VLLM_PLUGINS": "none"},
    # opentelemetry-instrument with the SDK and exporters, our instrumentor and plugin off
    "sdk": {**EXPORT_ENV, "VLLM_PLUGINS": "none",
            "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "vllm_ttft"},
    "ours": EXPORT_ENV,
}
OFF = "off"  # the ours server's own process with our hooks switched off
WARM_EXPORT_S = 6.0  # the SDK's span batch interval (5 s) and a margin


def base_arm(arm: str) -> str:
    """``plain2``, ``ours3``: a control copy of ``plain``, ``ours`` (same environment, a server
    of its own), so a run shows what two identical servers differ by."""
    if arm == OFF:
        return "ours"
    base = arm.rstrip("0123456789")
    if base not in ARMS:
        raise SystemExit(f"--arms: unknown arm {arm!r} (plain, sdk, ours, or one of them with a "
                         "number: a control copy)")
    return base


def place(server: VllmServer, placement: tuple[set[int], set[int]]) -> None:
    """The API server alone on its CPUs, as on a GPU host where it has a core of its own; the rest
    of the server (EngineCore, worker) beside the client. Without it the kernel moves the API
    server between sharing a core with EngineCore's busy loop and having one to itself, and the
    same run's API CPU per request then differs by 30-80 %."""
    for role, pids in processes(server).items():
        pin(pids, placement[0] if role == "api" else placement[1])


def probe_counts(server: VllmServer, path: Path) -> dict | None:
    """The API server's garbage-collection counts so far (``api_probe.py``), if it runs one."""
    path.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR2)
    for _ in range(50):
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.02)
    return None


def make_servers(arms: list[str], model_dir: Path, work: Path, endpoint: str, extra: dict,
                 placement: tuple[set[int], set[int]] | None, probe: bool, meter: bool = False,
                 vllm_traces: str | None = None) -> dict[str, VllmServer]:
    """One server per arm, not started; ``off`` is the ``ours`` server with its hooks switched
    off (``api_probe.py``). ``vllm_traces``: an OTLP/HTTP traces URL for vLLM's own request
    tracing, switched on and off at run time in the ``ours`` servers (``api_probe.py``)."""
    probed = [sys.executable, str(Path(__file__).with_name("api_probe.py"))]
    servers: dict[str, VllmServer] = {}
    for arm in arms:
        if arm == OFF:
            continue
        base = base_arm(arm)
        launcher = probed if probe or (base == "ours" and OFF in arms) else [sys.executable]
        env = {**ARM_ENV[base], **(extra if base == "ours" else {}),
               "BENCH_PROBE_FILE": str(work / f"{arm}.gc.json")}
        if meter and arm == "ours":
            env["BENCH_PROBE_METER"] = "1"
        if vllm_traces and base == "ours":  # vLLM's exporter over OTLP/HTTP, as ours
            env.update(BENCH_PROBE_VLLM_TRACES=vllm_traces,
                       OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf")
        if placement:  # vLLM-CPU binds its worker's OpenMP threads itself
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(placement[1])))
        if base != "plain":
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        server = VllmServer(model_dir, instrument=base != "plain", env=env,
                            log_path=work / f"{arm}.log")
        if launcher is probed or base != "plain":
            prefix = ([str(Path(sys.executable).parent / "opentelemetry-instrument")]
                      if base != "plain" else [])
            command = server.command()
            module_at = command.index("-m")
            server.argv = [*prefix, *launcher, *command[module_at:]]
        servers[arm] = server
    if OFF in arms:
        servers[OFF] = servers["ours"]
    return servers


def switch(server: VllmServer, probe_file: Path, flush: bool = False, **want: str) -> dict:
    """That API server to the state wanted (``hooks="on"|"off"``, ``vllm_tracing="on"|"off"``;
    ``flush``: its spans exported now; ``api_probe.py``'s ``SIGUSR1``), confirmed; the state it
    reports."""
    want_file, done = Path(f"{probe_file}.want"), Path(f"{probe_file}.switch")
    tmp = Path(f"{want_file}.tmp")
    tmp.write_text(json.dumps({**want, "flush": flush}))
    tmp.replace(want_file)
    done.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR1)
    for _ in range(750):  # a flush to a live receiver: well under 15 s
        if done.exists():
            break
        time.sleep(0.02)
    else:
        raise SystemExit(f"{server.log_path}: the server did not answer SIGUSR1")
    state = json.loads(done.read_text())
    if any(state.get(key) != value for key, value in want.items()):
        raise SystemExit(f"could not switch to {want}: the server reports {state}")
    return state


def start_all(servers: dict[str, VllmServer], model: str, prompts: list[list[int]],
              max_tokens: int, placement: tuple[set[int], set[int]] | None) -> dict:
    """Starts every server (one after the other: two vLLM start-ups at once on a small machine
    each take longer than both in turn), places it, runs a discarded warm-up, pauses it;
    returns each arm's thread names."""
    for server in dict.fromkeys(servers.values()):
        server.start()
        if placement:
            place(server, placement)
        # Warm-up, discarded: untraced and traced requests, then one span export interval, so
        # that one-time work (caches filled by the first request of each kind, the exporter's
        # first connection) lands in no measured run.
        run(server, model, prompts[:32], max_tokens, "c4", False)
        run(server, model, prompts[:32], max_tokens, "c4", True)
        time.sleep(WARM_EXPORT_S)
        pause(server, True)
    return {arm: thread_names(s.pid) for arm, s in servers.items()}


def stop_all(servers: dict[str, VllmServer]) -> None:
    for server in dict.fromkeys(servers.values()):
        if server.pid is not None:
            pause(server, False)
        server.stop()
