"""Which model runner vLLM would build, and which start-up stages otel-ttft measures on it: the
runner part of ``otel-ttft doctor``.

The choice is vLLM's own: ``VllmConfig.use_v2_model_runner`` on the config vLLM builds from the
serve arguments given (a default config without them), under the environment given, then the
runner the platform's worker builds for that answer (``runners.RUNNERS``, as
``_make_model_runner``). For another platform than this host's (``--device cuda`` on a CPU
machine), vLLM's own decision is run with one input given instead of this host's: Triton counted
usable where it is installed here (whether it sees a GPU driver there cannot be read from here;
the report says so). vLLM's modules are never written: the decision's code runs over a copy of
its module's globals.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import types
from collections.abc import Iterator
from typing import Any

from otel_ttft.runtime.hooks import runners

_SERVER_PARSERS = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                   "vllm.entrypoints.openai.cli_args")


class RunnerChoiceError(Exception):
    """The serve arguments did not make a vLLM config (the message says why, in vLLM's words)."""


def devices() -> list[str]:
    """The platforms whose worker builds a runner we know (``--device`` choices)."""
    return sorted({p for runner in runners.RUNNERS for p in runner.platforms})


def _serve_parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for module in _SERVER_PARSERS:
        try:
            return importlib.import_module(module).make_arg_parser(FlexibleArgumentParser())
        except (ImportError, AttributeError):
            continue
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())


def build_config(serve_args: list[str], device: str | None = None) -> Any:
    """vLLM's config for these serve arguments, built by vLLM (its parser, ``EngineArgs``); a
    default ``VllmConfig`` when none are given (on ``device`` when named: vLLM infers none on a
    host without its platform)."""
    from vllm.config import DeviceConfig, VllmConfig

    if not serve_args:
        try:
            if device is not None:
                return VllmConfig(device_config=DeviceConfig(device=device))
            return VllmConfig()
        except Exception as exc:  # noqa: BLE001 - vLLM refusing this environment is the answer
            raise RunnerChoiceError(f"vLLM refuses this configuration: {exc}") from exc
    from vllm.engine.arg_utils import AsyncEngineArgs

    parser = _serve_parser()
    try:
        namespace = parser.parse_args(serve_args)
    except SystemExit as exc:  # argparse has printed vLLM's own message
        raise RunnerChoiceError(f"vLLM's argument parser refused {serve_args}") from exc
    try:
        return AsyncEngineArgs.from_cli_args(namespace).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - vLLM's message is the answer
        raise RunnerChoiceError(f"vLLM could not build its config: {type(exc).__name__}: "
                                f"{exc}") from exc


def triton_installed() -> bool:
    """Whether Triton is installed here (what vLLM's check answers on a host whose GPU driver
    Triton sees)."""
    return importlib.util.find_spec("triton") is not None


def decide_v2(config: Any, triton: bool) -> bool:
    """vLLM's own ``VllmConfig.use_v2_model_runner`` on ``config``, with Triton usable or not as
    given: the property's code, run over a copy of its module's globals with ``HAS_TRITON``
    replaced, so vLLM's module is left as it is. Where it reads no ``HAS_TRITON``, its answer."""
    fget = type(config).use_v2_model_runner.fget
    if "HAS_TRITON" not in fget.__code__.co_names:
        return bool(fget(config))
    scope = {**fget.__globals__, "HAS_TRITON": triton}
    decide = types.FunctionType(fget.__code__, scope, fget.__name__, fget.__defaults__,
                                fget.__closure__)
    return bool(decide(config))


def unsupported_features(config: Any) -> list[str] | None:
    """The features this config uses that Model Runner V2 lacks, as vLLM lists them (None where
    this vLLM does not say)."""
    read = getattr(config, "_get_v2_model_runner_unsupported_features", None)
    try:
        return list(read()) if callable(read) else None
    except Exception:  # noqa: BLE001 - a list vLLM cannot make is left out of the reason
        return None


@contextlib.contextmanager
def _v2_unforced() -> Iterator[None]:
    """``VLLM_USE_V2_MODEL_RUNNER`` out of this process's environment while vLLM builds a config
    for another platform: its check that V2 can run there (Triton) would be this host's; whether
    V2 is chosen there is asked after, of vLLM's decision (:func:`decide_v2`)."""
    saved = os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved


def _class_of(target: str) -> type | None:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - not importable here is an answer
        return None


def _owner_class(hook_target: str) -> type | None:
    module, _, qualname = hook_target.partition(":")
    owner = qualname.rsplit(".", 1)[0] if "." in qualname else None
    return _class_of(f"{module}:{owner}") if owner else None


def coverage(runner: runners.Runner, hooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stage of ``runner``: the hook that measures it and whether it does here. A hook on a
    runner method counts only if the runner has that class among its bases (a target that
    resolves on a class that will not run covers nothing)."""
    by_name = {h["name"]: h for h in hooks}
    cls = _class_of(runner.target)
    rows = []
    for stage, name in runner.stages.items():
        if name is None:
            rows.append({"stage": stage, "hook": None, "status": "n/a",
                         "detail": "does not happen on this runner's device"})
            continue
        hook = by_name.get(name)
        owner = _owner_class(hook["target"]) if hook else None
        runs_here = owner is None or not _is_runner_class(owner) or (
            cls is not None and owner in cls.__mro__)
        if hook is None or not hook["resolved"]:
            status, detail = "MISSING", hook["detail"] if hook else "no such hook"
        elif not runs_here:
            status, detail = "MISSING", f"{hook['target']} is not a base of {runner.target}"
        else:
            status, detail = "ok", hook["target"]
        rows.append({"stage": stage, "hook": name, "status": status, "detail": detail})
    return rows


def _is_runner_class(owner: type) -> bool:
    return any(_class_of(r.target) is not None and owner in _class_of(r.target).__mro__
               for r in runners.RUNNERS)


def choose(device: str | None, serve_args: list[str],
           hooks: list[dict[str, Any]]) -> dict[str, Any]:
    """The runner vLLM would build on ``device`` (this host's platform when ``None``) for these
    serve arguments, why, and its stage coverage; ``{"error": ...}`` where this vLLM lacks what
    the choice is read from."""
    try:
        from vllm.config import VllmConfig
        from vllm.platforms import current_platform

        host = current_platform.device_type
        VllmConfig.use_v2_model_runner  # noqa: B018 - vLLM's choice must be there to read
    except Exception as exc:  # noqa: BLE001 - an older or broken vLLM: doctor says so
        return {"error": f"cannot read vLLM's runner choice: {type(exc).__name__}: {exc}",
                "idle_hooks": []}
    if not host and device is None:
        return {"error": "vLLM finds no platform on this host (no GPU, not a CPU build); name "
                         "one with --device", "idle_hooks": []}
    target_device = device or host
    assumption = None
    if target_device == host:
        config = build_config(serve_args)
        use_v2 = bool(config.use_v2_model_runner)
        reason = runners.choice_reason(config, unsupported=unsupported_features(config))
    else:
        installed = triton_installed()
        with _v2_unforced():
            # vLLM infers no device where it finds no platform: name it then (only then: a
            # platform's own checks refuse a device of another)
            config = build_config(serve_args, None if host else target_device)
        use_v2 = decide_v2(config, installed)
        reason = runners.choice_reason(config, use_v2=use_v2, triton=installed,
                                       unsupported=unsupported_features(config))
        triton = "usable (installed here)" if installed else "absent (not installed here)"
        assumption = f"not this host's platform ({host or 'none'}): Triton counted as {triton}"
    runner = runners.runner_for(target_device, use_v2, bool(config.is_mm_encoder_only))
    result: dict[str, Any] = {
        "device": target_device, "host_device": host, "assumption": assumption,
        "v2": use_v2, "reason": reason, "serve_args": serve_args,
        "runner": runner.class_path if runner else None,
        "runner_importable": bool(runner and _class_of(runner.target) is not None),
        "stages": coverage(runner, hooks) if runner else [],
        "workers": workers(config),
    }
    # Runner-specific hooks that belong to runners that will not run: they resolve, but cover
    # nothing here.
    own = {*runner.stages.values(), runner.graph_decision} if runner else set()
    result["idle_hooks"] = sorted({name for r in runners.RUNNERS
                                   for name in (*r.stages.values(), r.graph_decision)
                                   if name is not None} - own)
    return result


def workers(config: Any) -> dict[str, Any]:
    """How many workers this configuration starts on this host, from vLLM's own parallel config:
    ``world_size`` (tensor x pipeline parallel) per engine, ``data_parallel_size_local`` engines
    here, and the executor that starts them."""
    parallel = getattr(config, "parallel_config", None)

    def number(name: str, default: int = 1) -> int:
        value = getattr(parallel, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    per_engine = number("world_size")
    engines = number("data_parallel_size_local", number("data_parallel_size"))
    backend = getattr(parallel, "distributed_executor_backend", None)
    return {"workers": per_engine * engines, "per_engine": per_engine, "engines_here": engines,
            "tensor_parallel_size": number("tensor_parallel_size"),
            "pipeline_parallel_size": number("pipeline_parallel_size"),
            "data_parallel_size": number("data_parallel_size"),
            "executor": backend if isinstance(backend, str) else
            getattr(backend, "__name__", None) or "vLLM's default"}


def render_workers(w: dict[str, Any]) -> str:
    """The workers line of doctor's report."""
    return (f"workers: {w['workers']} on this host ({w['per_engine']} per engine: "
            f"--tensor-parallel-size {w['tensor_parallel_size']} x --pipeline-parallel-size "
            f"{w['pipeline_parallel_size']}; {w['engines_here']} engine(s) of "
            f"--data-parallel-size {w['data_parallel_size']} here; executor {w['executor']}); "
            "each worker's spans and stage metrics carry its ranks (ttft.parallel.*)")


def render(choice: dict[str, Any]) -> list[str]:
    """The text lines of the runner report."""
    if "error" in choice:
        return [f"model runner: {choice['error']}"]
    where = choice["device"] if choice["device"] == choice["host_device"] else (
        f"{choice['device']} (asked; this host: {choice['host_device'] or 'no vLLM platform'})")
    runner = choice["runner"] or "none otel-ttft knows"
    if choice["runner"] and not choice["runner_importable"]:
        runner += " (NOT importable in this vLLM)"
    lines = [f"model runner on {where}: {runner} "
             f"({'Model Runner V2' if choice['v2'] else 'V1'})",
             f"  why: {choice['reason']}"]
    if choice["assumption"]:
        lines.append(f"  note: {choice['assumption']}")
    if choice.get("workers"):
        lines.append(render_workers(choice["workers"]))
    for row in choice["stages"]:
        lines.append(f"  {row['status']:<7} {row['stage']:<22} "
                     f"{row['hook'] or '-'}: {row['detail']}")
    return lines
