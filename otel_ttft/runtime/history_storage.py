"""Where the live verdict's activation history is kept, and whether it outlives the container.

The verdict judges a start against the earlier starts kept in one file
(``OTEL_TTFT_VERDICT_HISTORY``, else ``$VLLM_CACHE_ROOT/otel-ttft/activations.json``). In a
container that path sits, unless the user mounted something there, on the container's writable
layer (``overlay``) or on a ``tmpfs``: both go with the container, and every fresh container then
says "no baseline". This module finds the mount that holds the path (the longest mount point in
``/proc/self/mountinfo`` that contains it) and says whether its file system is one a container
loses. Pure functions over the text read, so the tests feed crafted mountinfo. ``otel-ttft
doctor`` reports it (:func:`where`, :func:`render`); :func:`lost_note` is the few words for the
live verdict's log line. Standard library and the settings' names only, so that the runtime may
take this module as it is (the layering forbids it to import a tool).

What it cannot see: a volume that is itself thrown away (a Kubernetes ``emptyDir`` on the node's
disk, ``docker run --rm`` with an anonymous volume) reads as kept, being a mount of a real disk.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from otel_ttft.runtime.environment_variables import OTEL_TTFT_VERDICT_HISTORY

# File systems whose content goes with the container (overlay: the writable layer; tmpfs and
# ramfs: memory; aufs and fuse-overlayfs: older or rootless writable layers).
LOST_FS_TYPES = frozenset({"overlay", "overlayfs", "aufs", "tmpfs", "ramfs", "fuse-overlayfs"})
# File systems in memory: lost at a reboot even outside a container.
MEMORY_FS_TYPES = frozenset({"tmpfs", "ramfs"})

VOLUME_DIR = "/var/lib/otel-ttft"
FIX = (f"-v ttft-history:{VOLUME_DIR} "
       f"-e {OTEL_TTFT_VERDICT_HISTORY}={VOLUME_DIR}/activations.json")

_CGROUP_HINTS = ("docker", "kubepods", "containerd", "libpod", "lxc", "podman", "crio")


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where it is mounted, what, and from where."""

    mount_point: str
    fs_type: str
    source: str
    root: str


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of ``/proc/self/mountinfo`` text, in its order (a later mount on the same point
    covers an earlier one). Lines that do not parse are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        mounts.append(Mount(mount_point=_unescape(fields[4]), fs_type=fields[sep + 1],
                            source=_unescape(fields[sep + 2]), root=_unescape(fields[3])))
    return mounts


def _contains(mount_point: str, path: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path`` (absolute, symlinks resolved): the longest mount point that
    contains it, the last one listed where several share it."""
    best: Mount | None = None
    for mount in mounts:
        if _contains(mount.mount_point, path) and (
                best is None or len(mount.mount_point) >= len(best.mount_point)):
            best = mount
    return best


def resolved(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute with the symlinks of its nearest existing ancestor resolved (the
    history file need not exist yet)."""
    p = Path(path).expanduser().absolute()
    missing: list[str] = []
    while not p.exists() and p != p.parent:
        missing.append(p.name)
        p = p.parent
    with contextlib.suppress(OSError):
        p = p.resolve()
    for name in reversed(missing):
        p = p / name
    return str(p)


def container_hints(exists: Callable[[str], bool], environ: Mapping[str, str],
                    cgroup_text: str, mounts: list[Mount]) -> list[str]:
    """Why this process looks like it runs in a container (empty: it does not)."""
    hints = [marker for marker in ("/.dockerenv", "/run/.containerenv") if exists(marker)]
    if environ.get("container"):
        hints.append(f"container={environ['container']}")
    if environ.get("KUBERNETES_SERVICE_HOST"):
        hints.append("KUBERNETES_SERVICE_HOST")
    cgroups = [word for word in _CGROUP_HINTS if word in cgroup_text]
    if cgroups:
        hints.append(f"cgroup ({', '.join(cgroups)})")
    root = mount_of("/", mounts)
    if root is not None and root.mount_point == "/" and root.fs_type in LOST_FS_TYPES:
        hints.append(f"root file system is {root.fs_type}")
    return hints


def assess(path: str, mounts: list[Mount], hints: list[str]) -> dict:
    """Whether the history at ``path`` (resolved) outlives the container: ``kept`` is False on a
    file system a container loses (in a container), or one in memory (anywhere); True on any
    other mount (a bind mount or volume); None when no mount holds it."""
    mount = mount_of(path, mounts)
    in_container = bool(hints)
    if mount is None:
        kept, why = None, "no mount found for it"
    elif mount.fs_type in MEMORY_FS_TYPES:
        kept = False
        why = (f"on {mount.fs_type} at {mount.mount_point}: lost when the container stops"
               if in_container else f"on {mount.fs_type} at {mount.mount_point}: lost at reboot")
    elif in_container and mount.fs_type in LOST_FS_TYPES:
        kept = False
        where = ("the container's own file system" if mount.mount_point == "/"
                 else f"{mount.mount_point}")
        why = f"on {where} ({mount.fs_type}): lost when the container is removed"
    else:
        kept = True
        why = f"on {mount.fs_type} mounted at {mount.mount_point}"
    return {"mount_point": mount.mount_point if mount else None,
            "fs_type": mount.fs_type if mount else None,
            "in_container": in_container, "container_hints": hints, "kept": kept, "why": why}


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def vllm_cache_root(environ: Mapping[str, str]) -> tuple[str, str]:
    """vLLM's cache root and where it came from: ``vllm.envs`` where vLLM imports, else the
    same rule (``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``)."""
    try:
        import vllm.envs as envs

        return os.path.expanduser(str(envs.VLLM_CACHE_ROOT)), "VLLM_CACHE_ROOT as vLLM resolves it"
    except Exception:  # noqa: BLE001 - no vLLM (or a broken one): vLLM's rule, by hand
        pass
    if environ.get("VLLM_CACHE_ROOT"):
        return os.path.expanduser(environ["VLLM_CACHE_ROOT"]), "VLLM_CACHE_ROOT"
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vllm"), "vLLM's default cache root"


def where(environ: Mapping[str, str] | None = None) -> dict:
    """The history's path, where the path came from, and :func:`assess` of it on this host."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(OTEL_TTFT_VERDICT_HISTORY, "").strip()
    if explicit:
        path, source = os.path.expanduser(explicit), OTEL_TTFT_VERDICT_HISTORY
    else:
        root, root_source = vllm_cache_root(environ)
        path = os.path.join(root, "otel-ttft", "activations.json")
        source = f"default, under {root_source}"
    mounts = parse_mountinfo(_read("/proc/self/mountinfo"))
    hints = container_hints(os.path.exists, environ, _read("/proc/1/cgroup"), mounts)
    real = resolved(path)
    return {"path": path, "resolved": real, "source": source, **assess(real, mounts, hints)}


def here() -> tuple[list[Mount], list[str]]:
    """This process's mounts and container hints (what :func:`assess` takes)."""
    mounts = parse_mountinfo(_read("/proc/self/mountinfo"))
    return mounts, container_hints(os.path.exists, os.environ, _read("/proc/1/cgroup"), mounts)


def lost_note(path: str | os.PathLike[str], mounts: list[Mount] | None = None,
              hints: list[str] | None = None) -> str | None:
    """A few words for the live verdict's log line when it found no history at ``path`` and that
    path is on a file system a container loses (or a tmpfs); None where it is kept or unknown.
    Reads this process's mounts unless given them; never raises."""
    try:
        if mounts is None or hints is None:
            mounts, hints = here()
        got = assess(resolved(path), mounts, hints)
    except Exception:  # noqa: BLE001 - a note, never an error
        return None
    if got["kept"] is not False:
        return None
    return (f"none at {path}, {got['why']}; keep it on a volume with "
            f"{OTEL_TTFT_VERDICT_HISTORY} (otel-ttft doctor)")


def render(history: dict) -> list[str]:
    """doctor's lines for it: where, and a WARNING with the fix when it will not last."""
    shown = history["path"] + (f" (-> {history['resolved']})"
                               if history["resolved"] != history["path"] else "")
    lines = [f"verdict history: {shown} ({history['source']})"]
    if history["kept"] is False:
        lines.append(f"  WARNING {history['why']}; every fresh start says \"no baseline\". "
                     "Keep it on a volume: " + FIX
                     + " (or mount vLLM's cache root, VLLM_CACHE_ROOT); docs/production.md, "
                     "\"In a container\"")
    elif history["kept"] is None:
        lines.append(f"  NOTE    {history['why']}")
    else:
        note = (f" (in a container: {', '.join(history['container_hints'])}; a volume or bind "
                "mount)" if history["in_container"] and history["mount_point"] != "/" else "")
        lines.append(f"  ok      {history['why']}{note}")
    return lines
