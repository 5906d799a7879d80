"""Read the installed vLLM's vocabulary (its server flags, environment variables, loaders, routes,
the sleep level that clears its prefix cache, torch's cache variables) once per vLLM version, as
JSON data that the verdict (``otel_ttft.diagnosis.vocabulary``) names its changes with.

It walks vLLM's argument parser and reads vLLM's and torch's source text, so it runs beside vLLM,
never in a server: ``scripts/vllm-release-check`` and ``python -m otel_ttft.tools.vllm_vocabulary
--write`` ship the result in the package (``otel_ttft/diagnosis/vllm_vocabulary/VERSION.json``);
for a vLLM with none shipped, ``tools.analysis.knobs`` and the live verdict run this module in a
subprocess of the vLLM's interpreter (the standard library only, so it also runs by its source
text where otel_ttft is not installed) and keep its answer on disk.

Output: ``--json-line`` prints one line, ``OTEL_TTFT_KNOBS <json>``; ``--write DIR`` writes
``DIR/<vllm.__version__>.json`` (through a temporary file and a rename).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import tempfile

MARK = "OTEL_TTFT_KNOBS "
#: bumped when what :func:`read` returns changes (``Vocabulary.from_json`` reads every format)
FORMAT = 3
#: packages an alternative loader needs; whether they are installed is a fact of the host, looked
#: up where the vocabulary is used, never shipped
LOADER_PACKAGES = ("fastsafetensors", "runai_model_streamer")
_CACHE_ROOT = "VLLM_CACHE_ROOT"
_HOME_MARK = "/otel-ttft-home-mark"
_PARSERS = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
            "vllm.entrypoints.openai.cli_args")
# Where vLLM's OpenAI server declares its routes (what a warm-up request is sent to).
_ROUTERS = ("vllm.entrypoints.openai.chat_completion.api_router",
            "vllm.entrypoints.openai.completion.api_router",
            "vllm.entrypoints.serve.dev.sleep.api_router")


def read() -> dict:
    """What the vLLM importable here understands, as plain JSON data (``Vocabulary.from_json``),
    free of this host's paths (``VLLM_CACHE_ROOT``'s default is stored with ``~``)."""
    parser, parser_source = _parser()
    import vllm
    import vllm.envs as envs

    return {"format": FORMAT, "vllm_version": getattr(vllm, "__version__", None),
            "parser": parser_source, "options": _options(parser),
            "env": sorted(envs.environment_variables), "env_defaults": _env_defaults(envs),
            "load_formats": _load_formats(), "loader_packages": list(LOADER_PACKAGES),
            "torch_env": _torch_env(), "routes": _routes(),
            "sleep_clears_prefix_cache_from": _sleep_clears()}


def _parser() -> tuple[argparse.ArgumentParser, str]:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    for module in _PARSERS:
        try:
            make = importlib.import_module(module).make_arg_parser
            return make(FlexibleArgumentParser()), module + ".make_arg_parser"
        except (ImportError, AttributeError):
            continue
    from vllm.engine.arg_utils import EngineArgs

    return (EngineArgs.add_cli_args(FlexibleArgumentParser()),
            "vllm.engine.arg_utils.EngineArgs.add_cli_args")


def _plain(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _options(parser: argparse.ArgumentParser) -> dict[str, dict]:
    options = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        if nargs is None:
            nargs = 0 if isinstance(action, (argparse._StoreConstAction,
                                             argparse.BooleanOptionalAction)) else 1
        choices = None if action.choices is None else [_plain(c) for c in action.choices]
        negative = next((o for o in action.option_strings if o.startswith("--no-")), None)
        for opt in action.option_strings:
            options[opt] = {"dest": action.dest, "nargs": nargs, "choices": choices,
                            "default": _plain(action.default), "negative": opt == negative}
    return dict(sorted(options.items()))


def _env_defaults(envs: object) -> dict[str, str]:
    """``VLLM_CACHE_ROOT``'s default as vLLM derives it, with the home directory as ``~``: asked
    of ``vllm.envs`` with the variable and ``XDG_CACHE_HOME`` unset and ``HOME`` marked (this
    is a process of its own: its environment is ours to change for a moment)."""
    names = (_CACHE_ROOT, "XDG_CACHE_HOME", "HOME")
    saved = {n: os.environ.pop(n, None) for n in names}
    os.environ["HOME"] = _HOME_MARK
    try:
        value = str(envs.environment_variables[_CACHE_ROOT]())
    except Exception:  # noqa: BLE001 - a default we cannot read is left out, never guessed
        return {}
    finally:
        for n, v in saved.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v
    return {_CACHE_ROOT: value.replace(_HOME_MARK, "~", 1)} if value.startswith(
        _HOME_MARK) else {}


def _load_formats() -> list[str]:
    try:
        loaders = importlib.import_module("vllm.model_executor.model_loader")
        return sorted(getattr(loaders, "_LOAD_FORMAT_TO_MODEL_LOADER", None) or {})
    except Exception:  # noqa: BLE001
        return []


def _torch_env() -> list[str]:
    """The names torch's cache directories read, from its source (not imported for this)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return []
    source = os.path.join(os.path.dirname(spec.origin), "_inductor", "runtime",
                          "cache_dir_utils.py")
    try:
        with open(source, encoding="utf-8") as f:
            return sorted(set(re.findall(r"TORCHINDUCTOR_[A-Z_]+", f.read())))
    except OSError:
        return []


def _routes() -> list[str]:
    """vLLM's own route paths."""
    routes: list[str] = []
    for name in _ROUTERS:
        try:
            module = importlib.import_module(name)
            routes += [r.path for r in module.router.routes
                       if isinstance(getattr(r, "path", None), str)]
        except Exception:  # noqa: BLE001 - a route we cannot read is left out, never guessed
            continue
    return sorted(set(routes))


def _sleep_clears() -> int | None:
    """The lowest sleep level at which vLLM's engine clears the prefix cache
    (``EngineCore.sleep``: ``clear_prefix_cache = level >= N``), None where unread."""
    try:
        core = importlib.import_module("vllm.v1.engine.core")
        found = re.search(r"clear_prefix_cache\s*=\s*level\s*>=\s*(\d+)",
                          inspect.getsource(core.EngineCore.sleep))
        return int(found.group(1)) if found else None
    except Exception:  # noqa: BLE001
        return None


def write(data: dict, directory: str) -> str:
    """``data`` as ``directory/<vllm_version>.json`` (whole or not at all); its path."""
    version = str(data.get("vllm_version") or "")
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+_-]*", version):
        raise ValueError(f"not a version to name a file by: {version!r}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{version}.json")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vocabulary.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)  # package data: readable by whoever installs it
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m otel_ttft.tools.vllm_vocabulary",
                                  description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--write", metavar="DIR", help="write DIR/<vLLM version>.json")
    cli.add_argument("--json-line", action="store_true",
                     help=f"print one line: {MARK.strip()} <json> (the default)")
    args = cli.parse_args(argv)
    try:
        data = read()
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"cannot read vLLM's vocabulary: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.write:
        try:
            print(write(data, args.write))
        except (OSError, ValueError) as exc:
            print(f"cannot write the vocabulary: {exc}", file=sys.stderr)
            return 1
        return 0
    print(MARK + json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
