"""The installed vLLM's own knobs, in its own words: its server flags (the argument parser ``vllm
serve`` builds), its environment variables (``vllm.envs.environment_variables``) and its loaders,
so that every change we print is named as the vLLM that will run it names it, never from a table
of ours. Also here: reading a server command template the way vLLM's parser would (which flags it
sets) and editing one.

Pure and self-contained (the standard library only, vLLM imported inside :func:`read`), so that
two readers share it: the runtime reads the vLLM it runs in, in process, once a verdict needs a
fix; ``otel-ttft analyze`` runs this module's source in a fresh interpreter of the vLLM to
advise on (``tools.analysis.knobs``), since importing vLLM takes 10-60 s.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

# Tokens after which a server template's vLLM arguments start.
ENTRY_TOKENS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server", "serve")
_CACHE_ROOT = "VLLM_CACHE_ROOT"


def read(*, in_process: bool = False) -> dict:
    """What the vLLM importable here understands, as plain JSON data (``Vocabulary.from_json``).

    ``in_process``: read inside a running server, so the environment is left alone (another
    thread may be reading it) and ``VLLM_CACHE_ROOT``'s default comes from vLLM's own
    ``get_default_cache_root``; in a probe process of its own the variable is unset for a moment
    to ask ``vllm.envs`` what it defaults to."""
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
    if in_process:
        default_root = getattr(envs, "get_default_cache_root", None)
        try:
            if default_root is not None:
                defaults[_CACHE_ROOT] = os.path.join(str(default_root()), "vllm")
        except Exception:  # noqa: BLE001 - a name we cannot read is left out, never guessed
            pass
    else:
        saved = os.environ.pop(_CACHE_ROOT, None)
        try:
            defaults[_CACHE_ROOT] = str(envs.environment_variables[_CACHE_ROOT]())
        except Exception:  # noqa: BLE001
            pass
        finally:
            if saved is not None:
                os.environ[_CACHE_ROOT] = saved
    formats = []
    try:  # in a server, only where it is loaded already: no import on its behalf
        loaders = (sys.modules.get("vllm.model_executor.model_loader") if in_process
                   else importlib.import_module("vllm.model_executor.model_loader"))
        formats = sorted(getattr(loaders, "_LOAD_FORMAT_TO_MODEL_LOADER", None) or {})
    except Exception:  # noqa: BLE001
        pass
    installed = {m: importlib.util.find_spec(m) is not None
                 for m in ("runai_model_streamer", "fastsafetensors")}
    torch_env = []
    try:  # the names torch's cache directories read, from its source (not imported for this)
        import torch
        source = os.path.join(os.path.dirname(torch.__file__), "_inductor", "runtime",
                              "cache_dir_utils.py")
        with open(source, encoding="utf-8") as f:
            torch_env = sorted(set(re.findall(r"TORCHINDUCTOR_[A-Z_]+", f.read())))
    except Exception:  # noqa: BLE001
        pass
    import vllm
    routes, clears = _serving(in_process)
    return {"vllm_version": getattr(vllm, "__version__", None), "parser": parser_source,
            "options": options, "env": names, "env_defaults": defaults, "load_formats": formats,
            "loader_packages": installed, "torch_env": torch_env, "routes": routes,
            "sleep_clears_prefix_cache_from": clears}


# Where vLLM's OpenAI server declares its routes (what a warm-up request is sent to).
_ROUTERS = ("vllm.entrypoints.openai.chat_completion.api_router",
            "vllm.entrypoints.openai.completion.api_router",
            "vllm.entrypoints.serve.dev.sleep.api_router")


def _serving(in_process: bool) -> tuple[list[str], int | None]:
    """vLLM's own route paths, and the lowest sleep level at which its engine clears the prefix
    cache (``EngineCore.sleep``: ``clear_prefix_cache = level >= N``), None where unread."""
    routes: list[str] = []
    for name in _ROUTERS:
        try:
            module = sys.modules.get(name) if in_process else importlib.import_module(name)
            routes += [r.path for r in module.router.routes
                       if isinstance(getattr(r, "path", None), str)]
        except Exception:  # noqa: BLE001 - a route we cannot read is left out, never guessed
            continue
    clears = None
    try:
        import inspect

        core = (sys.modules.get("vllm.v1.engine.core") if in_process
                else importlib.import_module("vllm.v1.engine.core"))
        found = re.search(r"clear_prefix_cache\s*=\s*level\s*>=\s*(\d+)",
                          inspect.getsource(core.EngineCore.sleep))
        clears = int(found.group(1)) if found else None
    except Exception:  # noqa: BLE001
        pass
    return sorted(set(routes)), clears


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
    routes: frozenset[str] = frozenset()  # the OpenAI server's route paths
    #: the lowest sleep level at which vLLM's engine clears its prefix cache (None: not read)
    sleep_clears_prefix_cache_from: int | None = None

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
                   frozenset(data.get("torch_env", ())), frozenset(data.get("routes", ())),
                   data.get("sleep_clears_prefix_cache_from"))


# --- server command templates -------------------------------------------------------------------
class TemplateArgs:
    """A server command template split like a shell, with the vLLM flags it sets (by dest)."""

    def __init__(self, template: str, vocab: Vocabulary):
        self.template = template
        self.vocab = vocab
        self.tokens = shlex.split(template)
        self.start = next((i + 1 for i, t in enumerate(self.tokens) if t in ENTRY_TOKENS),
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
