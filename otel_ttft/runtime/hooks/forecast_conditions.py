"""The conditions a forecast reads now, without starting anything: small readers, each bounded.

- the checkpoint's page-cache residency: one ``mincore`` per shard (``hooks/load/pagecache``, the
  reading the load stage records), never its contents;
- whether the compile cache holds the model's artifacts: a :data:`CompileCacheProbe` (by
  default, the compile-cache reader on the key the model's last start used);
- which vLLM API servers run on this host, and which model each serves (``/proc`` command lines),
  so the one that must leave is known, and whether each sleeps (vLLM's ``/is_sleeping``);
- which other processes hold the GPU's memory (``nvidia-smi``, where there is one).

Each reader answers ``None`` (or nothing) where it cannot tell, with the reason in
``Conditions.notes``. Then :func:`forecasts` puts the history and these together with the pure
model (``otel_ttft.diagnosis.forecast``). Standard library only, besides that model: the API
server runs it off the request path (the forecast gauge), ``otel-ttft forecast`` and the replay
beside vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from otel_ttft.diagnosis import forecast as model
from otel_ttft.runtime import compile_cache
from otel_ttft.runtime.hooks.load import pagecache

SHARD_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MAX_SHARDS = 4096  # a checkpoint with more files than this is not read for residency
MAX_PROCS = 65536  # /proc entries looked at, at most
MAX_ASKED = 16  # servers asked whether they sleep, at most
SLEEP_TIMEOUT_S = 0.5
_SMI_TIMEOUT_S = 3.0

#: whether the compile cache holds a model's artifacts for this vLLM and torch, given the model's
#: latest start record (``None``: cannot tell)
CompileCacheProbe = Callable[[dict], "bool | None"]


@dataclass(frozen=True)
class PageCacheReading:
    """A checkpoint's shards on disk and their share in the page cache now."""

    files: int
    total_bytes: int
    resident_ratio: float | None  # weighted by size; None: mincore could not tell


@dataclass(frozen=True)
class RunningServer:
    """A vLLM API server on this host: its pid, the names it serves (its model, and the served
    name when given), its port, and whether it sleeps (vLLM's ``/is_sleeping``, where its dev
    endpoints are on; ``None``: not asked or no answer)."""

    pid: int
    names: tuple[str, ...]
    port: int | None = None
    sleeping: bool | None = None


def checkpoint_dir(reference: str, hf_home: str | None = None) -> Path | None:
    """The local directory of a checkpoint: the path itself, else a Hugging Face cache snapshot
    of a hub id (``org/name``), the newest one."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return path
    if reference.count("/") != 1 or reference.startswith(("/", ".")):
        return None
    hub = Path(hf_home or os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    snapshots = hub / "hub" / ("models--" + reference.replace("/", "--")) / "snapshots"
    with contextlib.suppress(OSError):
        found = sorted((p for p in snapshots.iterdir() if p.is_dir()),
                       key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None
    return None


def shard_files(directory: Path) -> list[Path]:
    """The weight files of a checkpoint directory (safetensors first; else the others)."""
    try:
        names = sorted(os.listdir(directory))[:MAX_SHARDS]
    except OSError:
        return []
    files = [directory / n for n in names if n.endswith(SHARD_SUFFIXES)]
    safetensors = [f for f in files if f.suffix == ".safetensors"]
    return safetensors or files


def page_cache(files: Sequence[Path], libc: Any = None) -> PageCacheReading:
    """Residency of ``files`` in the page cache, by size: mincore only, no byte read (``libc``
    from ``pagecache.open_libc``, which runs ``ldconfig``: found once per host reading)."""
    total, weighted, weight = 0, 0.0, 0
    if libc is None:
        with contextlib.suppress(OSError):
            libc = pagecache.open_libc()
    for f in files:
        try:
            size = f.stat().st_size
        except OSError:
            continue
        total += size
        ratio = pagecache.resident_ratio(f, libc=libc) if libc is not None else None
        if ratio is not None:
            weighted += ratio * max(size, 1)
            weight += max(size, 1)
    return PageCacheReading(len(files), total, weighted / weight if weight else None)


def compile_cache_dir_holds(record: dict) -> bool | None:
    """The default :data:`CompileCacheProbe`: whether vLLM's compile cache still holds artifacts
    under the key the model's last start used (its ``compile_cache_dir`` fact), read with the
    compile-cache reader (``runtime/compile_cache``: listings only); ``None`` when that start
    compiled nothing (eager) or named no directory."""
    facts = record.get("facts") or {}
    evidence = record.get("evidence") or {}
    used = facts.get("compile_cache_dir") or evidence.get("compile_cache_dir")
    if not isinstance(used, str) or not used:
        return None
    parts = Path(used).parts
    if compile_cache.COMPILE_DIR not in parts:
        return None
    root = Path(*parts[:parts.index(compile_cache.COMPILE_DIR)])
    state = compile_cache.inspect(root, mounts=[], hints=[]).state_for(used)
    return {compile_cache.STATE_PRESENT: True, compile_cache.STATE_UNKNOWN: None}.get(state,
                                                                                    False)


def running_servers(proc: str = "/proc") -> list[RunningServer]:
    """vLLM API servers on this host, from their command lines (``vllm serve M`` or
    ``-m vllm.entrypoints.openai.api_server --model M``, with ``--served-model-name``)."""
    found = []
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:MAX_PROCS]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read(65536).split(b"\0") if a]
        except OSError:
            continue
        names = served_names(argv)
        if names:
            found.append(RunningServer(int(pid), names, _port(argv)))
    return found


def _port(argv: Sequence[str]) -> int | None:
    for i, arg in enumerate(argv):
        flag, _, inline = arg.partition("=")
        if flag == "--port":
            value = inline or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else None
    return 8000  # vLLM's default


def is_sleeping(port: int, timeout_s: float = SLEEP_TIMEOUT_S) -> bool | None:
    """vLLM's ``GET /is_sleeping`` on this host's port (a dev endpoint: ``VLLM_SERVER_DEV_MODE``
    on); ``None`` without an answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping",  # noqa: S310
                                    timeout=timeout_s) as resp:
            data = json.loads(resp.read(4096))
    except (OSError, ValueError):
        return None
    value = data.get("is_sleeping") if isinstance(data, dict) else None
    return value if isinstance(value, bool) else None


def served_names(argv: Sequence[str]) -> tuple[str, ...]:
    """The model and served names of a vLLM API server's argv; empty for any other command."""
    if "vllm.entrypoints.openai.api_server" in argv:
        start = argv.index("vllm.entrypoints.openai.api_server") + 1
    elif "serve" in argv and any(Path(a).name == "vllm" for a in argv[:argv.index("serve")]):
        start = argv.index("serve") + 1
    else:
        return ()
    rest = list(argv[start:])
    names: list[str] = []
    if rest and not rest[0].startswith("-"):
        names.append(rest[0])
    for i, arg in enumerate(rest):
        flag, _, inline = arg.partition("=")
        if flag in ("--model", "--served-model-name"):
            if inline:
                names.append(inline)
            elif i + 1 < len(rest):
                names.append(rest[i + 1])
    return tuple(dict.fromkeys(names))


def device_memory_holders() -> tuple[tuple[str, ...], str | None]:
    """Processes holding GPU memory (``pid name``) and why not read (no ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return (), "no nvidia-smi: device memory not read"
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid,process_name",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return (), f"nvidia-smi failed: {type(exc).__name__}"
    holders = tuple(" ".join(p.strip() for p in line.split(",", 1))
                    for line in out.stdout.splitlines()[:64] if line.strip())
    return holders, None


@dataclass(frozen=True)
class Host:
    """What was read of the host once, for every model's forecast."""

    servers: tuple[RunningServer, ...] = ()
    device_held_by: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    libc: Any = None  # for mincore, found once (``pagecache.open_libc``)


def read_host(*, device: bool = True, libc: Any = None, ask_sleep: bool = True) -> Host:
    """The running servers (each asked whether it sleeps, ``ask_sleep``), the device memory's
    holders and libc (``libc``: one found before)."""
    holders, note = device_memory_holders() if device else ((), None)
    if libc is None:
        with contextlib.suppress(OSError):
            libc = pagecache.open_libc()
    servers = running_servers()
    if ask_sleep:
        servers = [replace(s, sleeping=is_sleeping(s.port))
                   if s.port and s.pid != os.getpid() and i < MAX_ASKED else s
                   for i, s in enumerate(servers)]
    return Host(tuple(servers), holders, (note,) if note else (), libc)


def _names(record: dict) -> set[str]:
    config = record.get("config") or {}
    return {n for n in (model.record_model(record), config.get("model_config.model")) if n}


def conditions(latest: dict, records: Iterable[dict], host: Host, *,
               outgoing: str | None = None, alone: bool = False,
               compile_probe: CompileCacheProbe = compile_cache_dir_holds) -> model.Conditions:
    """The conditions for the model of ``latest`` (its newest start record). ``outgoing``: the
    model that must leave first; by default, a running server of another model, if any
    (``alone``: none)."""
    records = list(records)
    notes = list(host.notes)
    ref = (latest.get("config") or {}).get("model_config.model") or model.record_model(latest)
    directory = checkpoint_dir(ref) if ref else None
    size = ratio = None
    if directory is None:
        notes.append(f"checkpoint {ref!r} is not a local directory: page cache not read")
    else:
        reading = page_cache(shard_files(directory), host.libc)
        if reading.files:
            size, ratio = reading.total_bytes, reading.resident_ratio
        else:
            notes.append(f"no weight files in {directory}: page cache not read")
    mine = _names(latest)
    holding = [s for s in host.servers if mine & set(s.names)]
    sleeping = (True if any(s.sleeping for s in holding)
                else False if any(s.sleeping is False for s in holding) else None)
    for s in holding:
        notes.append(f"served now by pid {s.pid}" + (" (asleep: a wake-up would bring it back)"
                                                     if s.sleeping else
                                                     ": a request finds it resident; this "
                                                     "forecasts its next start"))
    if outgoing is None and not alone:
        others = [s for s in host.servers if not mine & set(s.names)]
        if others:
            outgoing = _known(others[0].names, records)
    leaving = model.evictions(records, outgoing) if outgoing else []
    try:
        ready = compile_probe(latest)
    except Exception:  # noqa: BLE001 - a probe of someone else's: unknown, never an error
        ready = None
    return model.Conditions(
        checkpoint_bytes=size, resident_ratio=ratio, compile_cache_ready=ready,
        sleeping=sleeping, device_held_by=host.device_held_by, outgoing=outgoing,
        outgoing_evictions_s=tuple(leaving), notes=tuple(notes))


def _known(names: Sequence[str], records: Iterable[dict]) -> str:
    """The name the history knows a running server's model by (served name first)."""
    seen = {model.record_model(r) for r in records}
    return next((n for n in reversed(names) if n in seen), names[-1])


def forecasts(records: Sequence[dict], host: Host, *, only: Sequence[str] = (),
              outgoing: str | None = None, alone: bool = False,
              compile_probe: CompileCacheProbe = compile_cache_dir_holds
              ) -> list[model.Forecast]:
    """One forecast per model in the history (its latest configuration), in the order each was
    last started; ``only``: these models, a model with no start here saying "no history"."""
    latest_key: dict[str, list[dict]] = {}
    for starts in model.group_starts(records).values():
        name = model.record_model(starts[-1])
        if name:
            latest_key[name] = starts  # later keys of a model replace earlier ones
    wanted = list(only) or list(latest_key)
    out = []
    for name in wanted:
        starts = latest_key.get(name) or next(
            (s for s in latest_key.values() if name in _names(s[-1])), None)
        if starts is None:
            out.append(model.no_history(name))
            continue
        cond = conditions(starts[-1], records, host, outgoing=outgoing, alone=alone,
                          compile_probe=compile_probe)
        if cond.outgoing is not None and cond.outgoing in _names(starts[-1]):
            cond = replace(cond, outgoing=None, outgoing_evictions_s=())
        out.append(model.forecast(name, starts, cond, records))
    return out
