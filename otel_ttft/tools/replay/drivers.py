"""Switch drivers: how the replay makes a model available, the way a deployment would.

- ``restart``: stop one server (SIGTERM to the API server, like llama-swap or systemd), start the
  other from its command template.
- ``sleep``: both servers up with sleep mode; ``/sleep`` the outgoing one, ``/wake_up`` the next
  (vLLM's dev endpoints: ``VLLM_SERVER_DEV_MODE=1``, ``--enable-sleep-mode``; GPU only).
- ``resident``: both servers already running; nothing switches.
- ``proxy``: one router URL that swaps by model name (llama-swap): the request itself switches.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from otel_ttft.tools.replay.progress import Progress
from otel_ttft.tools.replay.server import HOST, ServerStartError, VllmServer, free_port

TEMPLATE_FIELDS = ("model", "name", "port", "host", "python", "instrument")
DEFAULT_TEMPLATE = (
    "{instrument} {python} -m vllm.entrypoints.openai.api_server --model {model} "
    "--served-model-name {name} --host {host} --port {port} --dtype bfloat16 "
    "--max-model-len 512 --max-num-seqs 4 --max-num-batched-tokens 512"
)  # prefix caching as vLLM's default (on): a switch that empties the cache is part of the story
SLEEP_ARGS = "--enable-sleep-mode --gpu-memory-utilization 0.35"
STOP_TIMEOUT_S = 120.0
CONTROL_TIMEOUT_S = 300.0  # /sleep and /wake_up of a real model can take a while


class TemplateError(ValueError):
    """A command template that cannot be expanded."""


class DriverError(RuntimeError):
    """A switch failed (a control endpoint answered an error, a server is not running)."""


@dataclass
class Target:
    """One servable model: its served name, and how to start or reach it."""

    name: str
    model: str = ""  # checkpoint dir or hub id, for {model}
    template: str = DEFAULT_TEMPLATE
    url: str | None = None  # already running (resident, sleep with URLs)
    adapters: tuple[str, ...] = ()  # LoRA names served by this target
    env: dict[str, str | None] = field(default_factory=dict)

    def serves(self, model: str) -> bool:
        return model == self.name or model in self.adapters


def expand(template: str, **fields: object) -> list[str]:
    """argv from a template: split like a shell, then fill ``{model}``, ``{port}``, ..."""
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise TemplateError(f"command template does not parse: {exc}") from exc
    if not argv:
        raise TemplateError("command template is empty")
    out = []
    for token in argv:
        try:
            out.append(token.format(**fields))
        except KeyError as exc:
            raise TemplateError(f"unknown placeholder {{{exc.args[0]}}} in command template "
                                f"(known: {', '.join(TEMPLATE_FIELDS)})") from exc
        except (ValueError, IndexError, AttributeError) as exc:
            raise TemplateError(f"bad placeholder in command template token {token!r}: {exc}"
                                ) from exc
    return out


def check_template(template: str) -> None:
    """Fail early (before any server starts) on a template the restart would choke on."""
    if "{port}" not in template:
        raise TemplateError("command template has no {port}: the driver picks the port")
    expand(template, model="m", name="n", port=1, host=HOST, python="python",
           instrument="opentelemetry-instrument")


class Driver(ABC):
    """Makes a target available; ``switch_to`` may block for the whole switch."""

    name = "?"

    def __init__(self, targets: Sequence[Target], progress: Progress):
        self.targets = list(targets)
        self.progress = progress
        self._lock = threading.Lock()  # concurrent requests: one of them switches, all wait

    def target_for(self, model: str) -> Target:
        for target in self.targets:
            if target.serves(model):
                return target
        raise DriverError(f"no target serves model {model!r}")

    @abstractmethod
    def switch_to(self, target: Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        """Make ``target`` the model being served (the others leave); its base URL.
        ``prepare`` runs right before ``target``'s server process starts, after the others
        left (restart), or before a router is asked for it (proxy); not when it was up."""

    @abstractmethod
    def keep_resident(self, targets: Sequence[Target]) -> None:
        """All of ``targets`` servable at once (resident-dual)."""

    @abstractmethod
    def url(self, target: Target) -> str:
        """Where ``target`` is served right now, without switching."""

    def generation(self, target: Target) -> object:
        """Changes whenever ``target``'s server may have been (re)activated since the last call
        (a start, a wake-up, a router swap): requests it served before then do not warm it."""
        return 0  # a server this driver never restarts

    def close(self) -> None:  # noqa: B027 - most drivers start nothing
        """Stop whatever this driver started."""


class RestartDriver(Driver):
    """Stop the outgoing server, start the next one from its template (CPU and GPU)."""

    name = "restart"

    def __init__(self, targets: Sequence[Target], progress: Progress, *, log_dir: Path,
                 env: Mapping[str, str | None], start_timeout_s: float = 600.0,
                 python: str = sys.executable):
        super().__init__(targets, progress)
        self.log_dir, self.env = Path(log_dir), dict(env)
        self.start_timeout_s, self.python = start_timeout_s, python
        self.servers: dict[str, VllmServer] = {}
        self._starts = 0
        self._start_of: dict[str, int] = {}  # target -> which start brought it up
        self._cold_dirs: list[tempfile.TemporaryDirectory] = []
        self._cache_env: dict[str, dict[str, str]] = {}

    def switch_to(self, target: Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        with self._lock:
            for name in [n for n in self.servers if n != target.name]:
                self._stop(name)
            if target.name not in self.servers:
                if prepare is not None:
                    prepare()
                self._start(target, cold=cold)
            return self.servers[target.name].url

    def generation(self, target: Target) -> object:
        """The start that brought the running server up (a counter: never reused)."""
        return self._start_of.get(target.name) if target.name in self.servers else None

    def keep_resident(self, targets: Sequence[Target]) -> None:
        with self._lock:
            for target in targets:
                if target.name not in self.servers:
                    self._start(target, cold=False)

    def url(self, target: Target) -> str:
        server = self.servers.get(target.name)
        if server is None:
            raise DriverError(f"{target.name} is not running")
        return server.url

    def close(self) -> None:
        with self._lock:
            for name in list(self.servers):
                self._stop(name)
            for tmp in self._cold_dirs:
                tmp.cleanup()
            self._cold_dirs.clear()
            self._cache_env.clear()

    def _start(self, target: Target, *, cold: bool) -> None:
        port = free_port()
        argv = expand(target.template, model=target.model, name=target.name, port=port,
                      host=HOST, python=self.python,
                      instrument=str(Path(self.python).parent / "opentelemetry-instrument"))
        if cold:  # an empty compile cache: nothing this model compiled before can be reused
            tmp = tempfile.TemporaryDirectory(prefix="otel-ttft-cold-")
            self._cold_dirs.append(tmp)
            # Later starts of this model keep this cache, as a deployment keeps its own.
            self._cache_env[target.name] = {
                "VLLM_CACHE_ROOT": tmp.name,
                "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp.name) / "inductor")}
        env = {**self.env, **target.env, **self._cache_env.get(target.name, {})}
        self._starts += 1
        self._start_of[target.name] = self._starts
        log = self.log_dir / f"vllm-{_safe(target.name)}-{self._starts}.log"
        server = VllmServer(target.model or target.name, port=port, env=env, log_path=log,
                            argv=argv, poll_s=0.1)
        with self.progress.step(f"starting {target.name}{' (cold caches)' if cold else ''}, "
                                f"log {log}"):
            server.start(timeout_s=self.start_timeout_s)
        self.servers[target.name] = server

    def _stop(self, name: str) -> None:
        server = self.servers.pop(name)
        with self.progress.step(f"stopping {name} (SIGTERM)"):
            server.stop(STOP_TIMEOUT_S, sig=signal.SIGTERM, group=False)


class SleepDriver(Driver):
    """vLLM sleep mode: every server stays up; the outgoing one sleeps, the next wakes (GPU)."""

    name = "sleep"

    def __init__(self, targets: Sequence[Target], progress: Progress, *,
                 restart: RestartDriver | None = None, level: int = 1,
                 http: httpx.Client | None = None):
        super().__init__(targets, progress)
        self.restart = restart  # starts the servers when targets have no URL
        self.level = level
        self.http = http or httpx.Client(timeout=CONTROL_TIMEOUT_S)
        self.asleep: set[str] = set()
        self._started = False
        self._wakes: dict[str, int] = {}

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._started = True
        missing = [t for t in self.targets if t.url is None]
        if missing:
            if self.restart is None:
                raise DriverError("sleep driver: no URL and no way to start "
                                  + ", ".join(t.name for t in missing))
            self.restart.keep_resident(missing)

    def url(self, target: Target) -> str:
        if target.url is not None:
            return target.url
        if self.restart is None:
            raise DriverError(f"{target.name} has no URL")
        return self.restart.url(target)

    def switch_to(self, target: Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        """``prepare`` is not run: a wake-up restores the weights from memory, not from the
        checkpoint, so its page-cache state says nothing about the switch."""
        with self._lock:
            self._ensure_started()
            for other in self.targets:
                if other.name != target.name and other.name not in self.asleep:
                    self._control(other, f"/sleep?level={self.level}", "putting to sleep")
                    self.asleep.add(other.name)
            if target.name in self.asleep:
                self._wake(target)
            return self.url(target)

    def generation(self, target: Target) -> object:
        started = self.restart.generation(target) if self.restart is not None else 0
        return (started, self._wakes.get(target.name, 0))

    def _wake(self, target: Target) -> None:
        self._control(target, "/wake_up", "waking")
        self.asleep.discard(target.name)
        self._wakes[target.name] = self._wakes.get(target.name, 0) + 1

    def keep_resident(self, targets: Sequence[Target]) -> None:
        with self._lock:
            self._ensure_started()
            for target in targets:
                if target.name in self.asleep:
                    self._wake(target)

    def _control(self, target: Target, path: str, what: str) -> None:
        url = self.url(target) + path
        with self.progress.step(f"{what} {target.name}"):
            try:
                resp = self.http.post(url)
            except httpx.HTTPError as exc:
                raise DriverError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            hint = " (is VLLM_SERVER_DEV_MODE=1 set?)" if resp.status_code == 404 else ""
            raise DriverError(f"{url} answered HTTP {resp.status_code}{hint}")

    def close(self) -> None:
        if self.restart is not None:
            self.restart.close()
        self.http.close()


class ResidentDriver(Driver):
    """Every target already running at its URL: no switch ever happens."""

    name = "resident"

    def switch_to(self, target: Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        return self.url(target)

    def keep_resident(self, targets: Sequence[Target]) -> None:
        pass

    def url(self, target: Target) -> str:
        if target.url is None:
            raise DriverError(f"resident driver: no URL for {target.name}")
        return target.url


class ProxyDriver(Driver):
    """One router URL (llama-swap and the like) that swaps by model name: the driver does
    nothing, the request itself triggers the switch inside the router."""

    name = "proxy"

    def __init__(self, targets: Sequence[Target], progress: Progress, *, proxy_url: str):
        super().__init__(targets, progress)
        self.proxy_url = proxy_url.rstrip("/")
        self._current: str | None = None
        self._swaps: dict[str, int] = {}

    def switch_to(self, target: Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        """The router swaps when the model asked for is not the one it serves: count that as a
        (re)activation, and run ``prepare`` before the request that makes it."""
        with self._lock:
            if self._current != target.name:
                if prepare is not None:
                    prepare()
                self._current = target.name
                self._swaps[target.name] = self._swaps.get(target.name, 0) + 1
        return self.proxy_url

    def generation(self, target: Target) -> object:
        return self._swaps.get(target.name, 0)

    def keep_resident(self, targets: Sequence[Target]) -> None:
        pass

    def url(self, target: Target) -> str:
        return self.switch_to(target)  # any request for a model makes the router serve it


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


@contextlib.contextmanager
def closing(driver: Driver):
    try:
        yield driver
    finally:
        driver.close()


__all__ = ["Driver", "DriverError", "ProxyDriver", "ResidentDriver", "RestartDriver",
           "ServerStartError", "SleepDriver", "Target", "TemplateError", "check_template",
           "closing", "expand"]
