"""Start-ups that hang and start-ups that die, against a real vLLM (CPU build, tiny model), spans
and metrics received over real OTLP. A test plugin (a real ``vllm.general_plugins`` entry point on
PYTHONPATH) holds the worker inside a checkpoint read, or makes KV-cache allocation raise.
Two server starts in all: the held start-up is then killed with SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import find_activation_roots
from otel_ttft.tools.replay.server import ServerStartError, VllmServer
from tests.export_env import EXPORT_ENV
from tests.prom_helpers import STUCK_RULE_FILE as RULE_FILE
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

FAULT_PLUGIN = '''
import os, time


def register():
    mode = os.environ.get("TTFT_TEST_FAULT")
    if mode == "hold":
        _hold_in_first_shard_read(os.environ["TTFT_TEST_HOLD_FILE"])
    elif mode == "kv_raise":
        from vllm.v1.worker import cpu_model_runner

        def broken(self, *args, **kwargs):
            raise RuntimeError("injected fault: KV cache allocation failed")

        cpu_model_runner.CPUModelRunner.initialize_kv_cache = broken


def _hold_in_first_shard_read(hold_file):
    """After the first tensor of the first shard (its read span is open), wait while the file
    exists: a checkpoint on a mount that stopped answering."""
    from vllm.model_executor.model_loader import weight_utils

    if getattr(weight_utils, "_ttft_test_held", False):
        return
    weight_utils._ttft_test_held = True
    inner_open = weight_utils.safe_open
    state = {"held": False}

    class Held:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def get_tensor(self, name):
            tensor = self._f.get_tensor(name)
            if not state["held"]:
                state["held"] = True
                deadline = time.monotonic() + 600
                while os.path.exists(hold_file) and time.monotonic() < deadline:
                    time.sleep(0.1)
            return tensor

    weight_utils.safe_open = lambda *a, **k: Held(inner_open(*a, **k))
'''


def _env(receiver, vllm_plugin, mode: str, **extra: str) -> dict[str, str]:
    return {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
            "TTFT_TEST_FAULT": mode, **extra,
            "PYTHONPATH": vllm_plugin("ttft_test_fault", FAULT_PLUGIN)}


def _start_expecting_failure(server: VllmServer) -> tuple[threading.Thread, list]:
    failures: list = []

    def run():
        try:
            server.start(timeout_s=900)
        except ServerStartError as exc:
            failures.append(exc)
        except Exception as exc:  # noqa: BLE001 - stopped from the test while starting
            failures.append(exc)
        else:
            failures.append(None)
            server.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failures


def _tree(store_dir: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", "tree", str(store_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _failed_root(receiver, timeout=120):
    def done(spans):
        return any(s["name"] == semconv.SPAN_ACTIVATION
                   and s["attributes"].get(semconv.ATTR_ACTIVATION_READY) is False
                   for s in spans)
    spans = receiver.wait_for_spans(done, timeout)
    (root,) = [r for r in find_activation_roots(spans)
               if r.attributes.get(semconv.ATTR_ACTIVATION_KIND) == "start"]
    return root, spans


def _in_progress(receiver, stage: str, kind: str) -> list[dict]:
    points = [p for p in receiver.store.metric_points()
              if p["name"] == semconv.METRIC_ACTIVATION_STAGE_IN_PROGRESS
              and p["attributes"].get(semconv.ATTR_STAGE) == stage
              and p["attributes"].get(semconv.ATTR_PROCESS_KIND) == kind]
    return sorted(points, key=lambda p: p["time_ns"])


@pytest.mark.timeout(1800)  # a start-up here takes 1-5 min, with other servers running
def test_held_in_a_checkpoint_read_then_killed(receiver, tiny_model, tmp_path, vllm_plugin):
    hold = tmp_path / "hold"
    hold.touch()
    env = _env(receiver, vllm_plugin, "hold", TTFT_TEST_HOLD_FILE=str(hold),
               OTEL_TTFT_SNAPSHOT_AFTER_S="3")
    server = VllmServer(tiny_model, env=env, extra_args=(*EAGER_ARGS,),
                        log_path=tmp_path / "server.log")
    thread, failures = _start_expecting_failure(server)
    try:
        # While held: the worker reports load.read in progress, growing, with the model.
        receiver.wait_for_spans(
            lambda _: len(_in_progress(receiver, semconv.STAGE_LOAD_READ, "worker")) >= 24, 900)
        points = _in_progress(receiver, semconv.STAGE_LOAD_READ, "worker")
        values = [p["value"] for p in points]
        assert values == sorted(values) and values[-1] > values[0] + 10, values
        assert points[-1]["attributes"][semconv.GEN_AI_REQUEST_MODEL] == str(tiny_model)

        # ... and the snapshots make the unfinished activation visible in the store.
        def snapshots(spans):
            unfinished = {s["name"] for s in spans
                          if s["attributes"].get(semconv.ATTR_SPAN_UNFINISHED) is True}
            return {semconv.SPAN_ACTIVATION, semconv.SPAN_SHARD_READ} <= unfinished
        spans = receiver.wait_for_spans(snapshots, 60)
        text = _tree(receiver.store.directory)
        root_line = next(line for line in text.splitlines()
                         if line.startswith(semconv.SPAN_ACTIVATION))
        assert "UNFINISHED" in root_line, text
        assert any(semconv.SPAN_SHARD_READ in line and "[load.read]" in line
                   and "UNFINISHED" in line for line in text.splitlines()), text

        # The stuck alert fires on these very series (see _promtool_on_received_series).
        _promtool_on_received_series(points, tmp_path)

        # Now the worker dies the hard way.
        (worker_start,) = [s for s in spans if s["name"] == semconv.SPAN_PROCESS_START
                           and s["attributes"][semconv.ATTR_PROCESS_KIND] == "worker"]
        os.kill(worker_start["attributes"][semconv.PROCESS_PID], signal.SIGKILL)
        thread.join(600)
        assert failures and failures[0] is not None, "the server started despite a dead worker"
        root, spans = _failed_root(receiver)
    finally:
        hold.unlink(missing_ok=True)
        server.stop()

    assert root.attributes[semconv.ATTR_ACTIVATION_FAILED_STAGE] == semconv.STAGE_LOAD_READ
    assert root.span["status"]["code"] == "ERROR"
    # EngineCore's span reports its dead child, with the stage it died in.
    reporters = {n.attributes[semconv.ATTR_PROCESS_KIND]: n for n in root.walk()
                 if semconv.ATTR_CHILD_PID in n.attributes}
    assert set(reporters) == {"engine_core", "api_server"}
    # EngineCore, in turn, failed: the API server's span reports that child too.
    assert reporters["api_server"].attributes[semconv.ATTR_CHILD_EXIT_CODE] != 0
    reporter = reporters["engine_core"]
    assert reporter.attributes[semconv.ATTR_CHILD_SIGNAL] == "SIGKILL"
    assert reporter.attributes[semconv.ATTR_CHILD_STAGE] == semconv.STAGE_LOAD_READ
    assert reporter.span["status"]["code"] == "ERROR"
    assert any(e["name"] == semconv.EVENT_CHILD_DIED for e in reporter.span["events"])
    # The worker's open spans, ended by its parent: the final copies replace the snapshots.
    (shard,) = [n for n in root.walk() if n.name == semconv.SPAN_SHARD_READ]
    assert shard.span["status"]["code"] == "ERROR"
    assert shard.attributes[semconv.ATTR_SPAN_ENDED_BY] == "parent"
    assert shard.attributes[semconv.ATTR_PROCESS_KIND] == "worker"
    assert semconv.ATTR_SPAN_UNFINISHED not in shard.attributes
    assert shard.parent is not None and shard.parent.name == "Load weights"
    text = _tree(receiver.store.directory)
    assert f"FAILED in {semconv.STAGE_LOAD_READ}" in text, text


@pytest.mark.timeout(1800)
def test_exception_in_kv_cache_allocation(receiver, tiny_model, tmp_path, vllm_plugin):
    server = VllmServer(tiny_model, env=_env(receiver, vllm_plugin, "kv_raise"),
                        extra_args=(*EAGER_ARGS,), log_path=tmp_path / "server.log")
    with pytest.raises(ServerStartError):
        server.start(timeout_s=900)
    root, _spans = _failed_root(receiver)
    assert root.attributes[semconv.ATTR_ACTIVATION_FAILED_STAGE] == semconv.STAGE_WARMUP_KV_ALLOC
    assert root.span["status"]["code"] == "ERROR"
    (kv,) = [n for n in root.walk() if n.name == semconv.SPAN_KV_ALLOC]
    assert kv.span["status"]["code"] == "ERROR"
    assert kv.attributes[semconv.ATTR_PROCESS_KIND] == "worker"
    assert any("injected fault" in str(e["attributes"]) for e in kv.span["events"]
               if e["name"] == "exception")


# --- the alert on the received series ---
def _prom_label(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key)


def _humanize_duration(v: float) -> str:
    """Prometheus's humanizeDuration for values of a minute and more."""
    v = int(v)
    d, h, m, s = v // 86400, v // 3600 % 24, v // 60 % 60, v % 60
    if d:
        return f"{d}d {h}h {m}m {s}s"
    if h:
        return f"{h}h {m}m {s}s"
    return f"{m}m {s}s"


def _promtool_on_received_series(points: list[dict], tmp_path: Path) -> None:
    """Each one-second sample the worker exported while held becomes a one-minute sample (value
    x60, whole seconds): the same series, labels and growth, at the time scale of a real hang."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    attrs = points[-1]["attributes"]
    labels = {"job": "vllm", "instance": "held",
              **{_prom_label(k): str(v) for k, v in attrs.items()}}
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series = f"ttft_activation_stage_in_progress_seconds{{{selector}}}"
    values = [int(p["value"] * 60) for p in points]
    n = len(values)
    no_baseline = next((i for i, v in enumerate(values) if v > 900), None)
    assert no_baseline is not None and no_baseline + 2 < n, values
    eval_min = no_baseline + 2  # over the floor, then held for the rule's 1 min
    model, stage = attrs[semconv.GEN_AI_REQUEST_MODEL], attrs[semconv.ATTR_STAGE]
    summary = (f"{model} has been in {stage} for {_humanize_duration(values[eval_min])} "
               f"(no baseline for this model and stage yet)")
    exp_labels = "\n".join(f"              {k}: {v!r}" for k, v in
                           sorted({**labels, "severity": "warning"}.items()))
    test = f"""rule_files:
  - {RULE_FILE}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{series}'
        values: '{" ".join(map(str, values))}'
    alert_rule_test:
      - eval_time: {eval_min}m
        alertname: OtelTtftActivationStuckNoBaseline
        exp_alerts:
          - exp_labels:
{exp_labels}
            exp_annotations:
              summary: {summary!r}
"""
    path = tmp_path / "stuck-from-received.test.yml"
    path.write_text(test)
    proc = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + test
