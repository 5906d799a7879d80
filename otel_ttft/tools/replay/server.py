"""Start and stop a real vLLM OpenAI-compatible server, optionally under
``opentelemetry-instrument``, the way a user would run it.

The server runs in its own process group so that stopping it also stops EngineCore and the
workers it spawned; stop never hangs (SIGINT, then SIGKILL to the group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from otel_ttft.runtime import clock

DEFAULT_ARGS = (
    "--dtype", "bfloat16", "--max-model-len", "512", "--max-num-seqs", "4",
    "--max-num-batched-tokens", "512",
)
HOST = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


def free_port(host: str = HOST) -> int:
    """A TCP port free right now on ``host`` (the usual race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1, as a context manager."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = HOST,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
        instrument: bool = True,
        log_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        argv: Sequence[str] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        if host != HOST:
            raise ValueError(f"VllmServer binds {HOST} only, not {host!r}")
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.instrument = instrument
        self.python = python
        self.argv = list(argv) if argv is not None else None  # a user's command, as is
        self.poll_s = poll_s  # health polling interval: it bounds the readiness gap we add
        self._log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        """The argv that ``start`` runs (``argv`` when given: a command template's expansion)."""
        if self.argv is not None:
            return list(self.argv)
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model_dir), "--host", self.host, "--port", str(self.port),
               *DEFAULT_ARGS, *self.extra_args]
        if self.instrument:
            # Next to ``python`` without resolving symlinks: the venv's own script.
            cmd = [str(Path(self.python).parent / "opentelemetry-instrument"), *cmd]
        return cmd

    def environment(self) -> dict[str, str]:
        """os.environ plus ``env``; a None value removes the variable."""
        env = {**os.environ, **clock.handed_down(), **self.env}  # one clock offset for all
        env = {k: v for k, v in env.items() if v is not None}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # else the CPU backend reserves ~8 GiB
        return env

    def start(self, timeout_s: float = 300) -> VllmServer:
        """Launch and wait for ``GET /health`` to answer 200."""
        if self._proc is not None:
            raise RuntimeError("server already started")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - lives as long as the server
        argv = self.command()
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=self._log_file,
                stderr=subprocess.STDOUT, env=self.environment(), start_new_session=True,
            )
        except OSError as exc:  # no such program, not executable
            self._log_file.close()
            self._log_file = None
            raise ServerStartError(f"cannot run {argv[0]!r}: {exc.strerror or exc} "
                                   f"(log: {self._log_path})") from exc
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self._fail(f"vLLM server exited with code {code} before becoming healthy")
            if self.healthy():
                return
            if time.monotonic() >= deadline:
                self._fail(f"vLLM server not healthy after {timeout_s:g} s")
            time.sleep(self.poll_s)

    def _fail(self, reason: str) -> None:
        raise ServerStartError(
            f"{reason} (log: {self._log_path}); last lines:\n{tail(self._log_path)}"
        )

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, timeout_s: float = 30, *, sig: int = signal.SIGINT,
             group: bool = True) -> int | None:
        """``sig`` to the process group (or, ``group=False``, to the API server only, as a swapper
        such as llama-swap does: vLLM then stops its own children), wait, then SIGKILL the group;
        returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = proc.pid  # leader gone; start_new_session made its pid the group id
        if group:
            _signal_group(pgid, sig)
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait(10)
        # Children (EngineCore, workers) get a short grace to flush telemetry, then no more.
        deadline = time.monotonic() + 5
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return proc.returncode

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# Signal-specific variables from the user's shell would override ours and send data elsewhere.
_UNSET = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")


def telemetry_env(endpoint: str) -> dict[str, str | None]:
    """Environment that makes every vLLM process export to ``endpoint`` over OTLP/HTTP."""
    env: dict[str, str | None] = dict.fromkeys(_UNSET)
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm-demo",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "none",
    })
    return env
