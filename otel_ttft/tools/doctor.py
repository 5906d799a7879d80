"""``otel-ttft doctor``: which hooks are live against the installed vLLM, whether the installed
OpenTelemetry SDK has the internals we use, and where spans go.

It says whether vLLM's vocabulary (the flags and variables the verdict's changes are named with)
ships for the installed version, or will be read from vLLM's parser on first use. It also names
the model runner vLLM would build (on this host, or on the platform ``--device``
names), under the environment (``--env``) and serve arguments (after ``--``) given, and which
start-up stages are measured on that runner; hooks on runners that will not run are "idle".
Last, where the live verdict keeps its history of earlier starts, with a WARNING when that is a
file system the container loses (its writable layer, a tmpfs) and the fix, and what vLLM's
compile cache holds (what the next start's compile will find), with the same warning.

Exit 0 when at least one hook can instrument vLLM, 1 when nothing can (no vLLM, an unsupported
version with every target moved), so a deploy script can gate on it; 2 when the arguments given
do not make a vLLM config.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from importlib.metadata import PackageNotFoundError, entry_points, requires, version
from typing import Any
from urllib.parse import urlparse

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from otel_ttft.diagnosis import vocabulary_store
from otel_ttft.runtime import compile_cache, history_storage
from otel_ttft.runtime.hooks import all_hooks
from otel_ttft.runtime.hooks.registry import resolve
from otel_ttft.runtime.vllm_version import SUPPORTED, installed_vllm, is_supported
from otel_ttft.tools import gpu_figures, host, runner_choice
from otel_ttft.tools.analysis import knobs

_ENTRY_POINT_GROUPS = ("opentelemetry_instrumentor", "vllm.general_plugins",
                       "opentelemetry_distro", "opentelemetry_configurator")


_NEEDS = {"capture_content": "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true"}


def _vllm_module_version() -> str | None:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:  # noqa: BLE001 - a broken install is something doctor reports
        return None


def _endpoint() -> tuple[str | None, str]:
    for var in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if os.environ.get(var):
            return os.environ[var], var
    return None, "default (localhost:4317 grpc / :4318 http)"


def _reachable(url: str | None, timeout_s: float = 1.0) -> bool | None:
    if url is None:
        return None
    try:
        parsed = urlparse(url if "://" in url else f"http://{url}")
        port = parsed.port or (443 if parsed.scheme == "https" else 4317)
    except ValueError:  # a port out of range or not a number: not reachable, and not a crash
        return False
    if not parsed.hostname:
        return None
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _opentelemetry() -> dict[str, Any]:
    """The installed SDK against the range our distribution declares, and whether our
    configurator is the one ``opentelemetry-instrument`` will run (its bounded exit)."""
    try:
        installed: str | None = version("opentelemetry-sdk")
        declared = [Requirement(r) for r in requires("otel-ttft") or ()]
    except PackageNotFoundError:
        installed, declared = None, []
    spec = next((r.specifier for r in declared if r.name == "opentelemetry-sdk"), None)
    try:
        supported = bool(installed and spec is not None and Version(installed) in spec)
    except InvalidVersion:
        supported = False
    return {"sdk_version": installed, "supported_range": str(spec) if spec else None,
            "supported": supported, **_configurator()}


def _configurator() -> dict[str, Any]:
    """Which configurator ``opentelemetry-instrument`` runs (its ``_load_configurators``): the one
    ``OTEL_PYTHON_CONFIGURATOR`` names, else the first found, in an order no install promises
    (``opentelemetry-distro`` registers one too); and the setting that makes it ours."""
    from otel_ttft.runtime import distro

    found = distro.configurators()
    chosen = os.environ.get("OTEL_PYTHON_CONFIGURATOR", "").strip()
    picked = distro.configurator_in_force()
    certain = picked == distro.NAME and (bool(chosen) or len(found) == 1)
    return {"configurator": picked or "none",
            "configurator_distribution": dict(found).get(picked or "", None),
            "configurators": [f"{name} ({dist})" for name, dist in found],
            "configurator_chosen": chosen or None,
            "configurator_setting": None if certain else distro.RESTORE}


def _vocabulary(module_version: str | None) -> dict[str, Any]:
    """Whether the installed vLLM's vocabulary ships with otel-ttft, or where it is kept once
    read on first use."""
    shipped = vocabulary_store.shipped(module_version) is not None
    root = vocabulary_store.vllm_dir()
    cache = (vocabulary_store.cache_file(knobs.cache_dir(), sys.executable, root)
             if root is not None and not shipped else None)
    return {"vllm_version": module_version, "shipped": shipped,
            "shipped_versions": vocabulary_store.shipped_versions(),
            "cache": str(cache) if cache else None,
            "cached": bool(cache and vocabulary_store.cached(cache) is not None)}


def _render_vocabulary(vocab: dict[str, Any]) -> list[str]:
    if vocab["shipped"]:
        return [f"  ok      vocabulary: shipped for vLLM {vocab['vllm_version']} (the verdict's "
                "flags and variables, in its words)"]
    others = ", ".join(vocab["shipped_versions"]) or "none"
    where = (f"already read, kept in {vocab['cache']}" if vocab["cached"] else
             "read from vLLM's argument parser on first use (a subprocess, once"
             + (f", kept in {vocab['cache']})" if vocab["cache"] else ")"))
    return [f"  NOTE    vocabulary: none shipped for vLLM {vocab['vllm_version']} (shipped: "
            f"{others}): {where}; python -m otel_ttft.tools.vllm_vocabulary --write "
            "otel_ttft/diagnosis/vllm_vocabulary adds it"]


def collect(device: str | None = None, serve_args: list[str] | None = None) -> dict[str, Any]:
    """Everything doctor knows, as data (the text report and --json both come from it).
    Raises ``runner_choice.RunnerChoiceError`` when ``serve_args`` make no vLLM config."""
    dist = installed_vllm()
    module_version = _vllm_module_version()
    hooks = []
    for hook in all_hooks():
        ok, detail = resolve(hook) if module_version is not None else (False, "vllm not importable")
        hooks.append({"name": hook.name, "target": hook.target, "process": hook.process,
                      "stage": hook.stage, "resolved": ok, "optional": hook.optional,
                      "needs": hook.needs, "detail": detail})
    from otel_ttft.runtime.hooks.load.formats import loader_report

    loaders = loader_report({h["name"]: h["resolved"] for h in hooks})
    model_runner = vocab = None
    if module_version is not None:
        vocab = _vocabulary(module_version)
        model_runner = runner_choice.choose(device, list(serve_args or []), hooks)
        if model_runner.get("device") in ("cuda", "xpu"):
            model_runner["gpu_figures"] = gpu_figures.rows(bool(model_runner.get("v2")))
        for h in hooks:
            h["idle"] = h["name"] in model_runner["idle_hooks"]
    ours = {group: [ep.name for ep in entry_points(group=group) if ep.value.startswith("otel_ttft")]
            for group in _ENTRY_POINT_GROUPS}
    endpoint, source = _endpoint()
    isa = host.cpu_isa()
    return {
        "host": {"cpu_isa": isa, "known_crashes": host.known_crashes(isa)},
        "vllm": {"distribution": dist[0] if dist else None, "version": dist[1] if dist else None,
                 "module_version": module_version, "supported_range": SUPPORTED,
                 "supported": bool(dist and is_supported(dist[1]))},
        "opentelemetry": _opentelemetry(),
        "hooks": hooks,
        "model_runner": model_runner,
        "vocabulary": vocab,
        "loaders": loaders,
        "entry_points": ours,
        "export": {"traces_exporter": os.environ.get("OTEL_TRACES_EXPORTER", "otlp (our distro)"),
                   "metrics_exporter": os.environ.get("OTEL_METRICS_EXPORTER", "otlp (our distro)"),
                   "protocol": os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                   "endpoint": endpoint, "endpoint_source": source,
                   "endpoint_reachable": _reachable(endpoint)},
        "verdict_history": _verdict_history(),
        "vllm_otlp_traces_endpoint": _vllm_endpoint(list(serve_args or [])),
        "compile_cache": _compile_cache(),
    }


def _vllm_endpoint(serve_args: list[str]) -> str | None:
    """vLLM's own ``--otlp-traces-endpoint`` among the serve arguments given, if any."""
    for i, arg in enumerate(serve_args):
        if arg == "--otlp-traces-endpoint" and i + 1 < len(serve_args):
            return serve_args[i + 1]
        if arg.startswith("--otlp-traces-endpoint="):
            return arg.split("=", 1)[1]
    return None


def _render_vllm_endpoint(url: str | None) -> list[str]:
    if not url:
        return []
    return [f"  warning: --otlp-traces-endpoint {url}: under opentelemetry-instrument our "
            "provider runs and vLLM cannot install its own; the API server's spans go to the "
            "OTEL_EXPORTER_OTLP_* endpoint, EngineCore's and the workers' to this URL (vLLM "
            "writes it into OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): one trace, two backends. Drop "
            f"the flag and set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={url}; with vLLM's plugin "
            "loader alone (no opentelemetry-instrument) the flag is the way"]


def render(report: dict[str, Any]) -> str:
    v = report["vllm"]
    lines = []
    if v["module_version"] is None:
        lines.append("vLLM: not importable")
    else:
        dist = f"{v['distribution']} {v['version']}" if v["distribution"] else "no distribution"
        support = ("supported" if v["supported"]
                   else f"NOT in the tested range {v['supported_range']}")
        lines.append(f"vLLM: module {v['module_version']} ({dist}); {support}")
        if report.get("vocabulary"):
            lines.extend(_render_vocabulary(report["vocabulary"]))
    lines.extend(_render_opentelemetry(report["opentelemetry"]))
    live = [h for h in report["hooks"] if h["resolved"]]
    idle = [h for h in live if h.get("idle")]
    lines.append(f"hooks: {len(live)} of {len(report['hooks'])} targets resolve"
                 + (f"; {len(idle)} of them on model runners that will not run here (idle)"
                    if idle else ""))
    for h in report["hooks"]:
        mark = ("idle   " if h.get("idle") else "ok     ") if h["resolved"] else (
            "absent " if h["optional"] else "MISSING")
        detail = "" if h["resolved"] else f"  ({h['detail']})"
        if h.get("needs"):  # applied only with that setting on
            detail += f"  (applied only with {_NEEDS.get(h['needs'], h['needs'])})"
        lines.append(f"  {mark} {h['name']:<28} {h['target']}{detail}")
    if report.get("model_runner"):
        lines.extend(runner_choice.render(report["model_runner"]))
        if report["model_runner"].get("device") in ("cuda", "xpu"):
            lines.extend(gpu_figures.render(bool(report["model_runner"].get("v2"))))
    lines.append("load formats (shard read spans):")
    for row in report.get("loaders", []):
        mark = "per-shard" if row["per_shard"] else "NOT HOOKED"
        lines.append(f"  {mark:<10} {row['format']}: {row['detail']}")
    for group, names in report["entry_points"].items():
        lines.append(f"entry point {group}: {', '.join(names) or 'NOT REGISTERED'}")
    h = report["host"]
    lines.append(f"host CPU: {', '.join(h['cpu_isa']) or 'no AVX2'}")
    lines.extend(f"  warning: {text}" for text in h["known_crashes"])
    e = report["export"]
    reach = {True: "reachable", False: "NOT reachable",
             None: "not checked"}[e["endpoint_reachable"]]
    lines.append(f"export: traces={e['traces_exporter']} metrics={e['metrics_exporter']} "
                 f"protocol={e['protocol']} endpoint={e['endpoint'] or e['endpoint_source']} "
                 f"({reach})")
    lines.extend(_render_vllm_endpoint(report.get("vllm_otlp_traces_endpoint")))
    lines.extend(_render_verdict_history(report.get("verdict_history")))
    lines.extend(_render_compile_cache(report.get("compile_cache")))
    return "\n".join(lines)


def _compile_cache() -> dict[str, Any] | None:
    """What vLLM's compile cache holds now (keys with artifacts), and whether it outlives a
    restart: what the next start's compile will find."""
    try:
        root, _source = history_storage.vllm_cache_root(os.environ)
        return compile_cache.inspect(root).summary()
    except Exception as exc:  # noqa: BLE001 - a report line, never doctor's crash
        return {"error": f"{type(exc).__name__}: {exc}"}


def _render_compile_cache(cache: dict[str, Any] | None) -> list[str]:
    if not cache:
        return []
    if "error" in cache:
        return [f"compile cache: not checked ({cache['error']})"]
    state = {"missing": "no compile cache yet", "empty": "empty (no artifacts under any key)"
             }.get(cache["state"], f"artifacts under {cache['keys_with_artifacts']} key(s)")
    lines = [f"compile cache: {cache['root']}/torch_compile_cache: {state}"
             + (" (listing truncated)" if cache["truncated"] else "")]
    if cache["disabled"]:
        lines.append("  WARNING VLLM_DISABLE_COMPILE_CACHE is set: every start compiles")
    if cache["kept"] is False:
        lines.append(f"  WARNING {cache['kept_why']}: every fresh start compiles again; keep "
                     "VLLM_CACHE_ROOT on a volume")
    return lines


def _verdict_history() -> dict[str, Any] | None:
    """Where the live verdict's history will be kept, and whether it outlives the container."""
    try:
        return history_storage.where()
    except Exception as exc:  # noqa: BLE001 - a report line, never doctor's crash
        return {"error": f"{type(exc).__name__}: {exc}"}


def _render_verdict_history(history: dict[str, Any] | None) -> list[str]:
    if not history:
        return []
    if "error" in history:
        return [f"verdict history: not checked ({history['error']})"]
    return history_storage.render(history)


def _render_opentelemetry(otel: dict[str, Any]) -> list[str]:
    support = ("supported" if otel["supported"]
               else f"NOT in the tested range {otel['supported_range']}")
    lines = [f"OpenTelemetry SDK: {otel['sdk_version'] or 'not installed'}; {support}"]
    name = otel["configurator"]
    setting = otel.get("configurator_setting")
    found = ", ".join(otel.get("configurators") or []) or "none"
    if name == "otel_ttft":
        note = "" if not setting else (
            f" (found first of {found}: the order can change with any install; set {setting} "
            "to make it certain)")
        lines.append(f"  {'ok     ' if not setting else 'NOTE   '} configurator: otel_ttft{note}")
        return lines
    if name == "none":
        why = (f"OTEL_PYTHON_CONFIGURATOR={otel.get('configurator_chosen')!r} names none of "
               f"{found}" if otel.get("configurator_chosen") else "none is installed")
        lines.append(f"  NOTE    configurator: none (not ours: {why}): no spans, no live verdict; "
                     f"set {setting or 'OTEL_PYTHON_CONFIGURATOR=otel_ttft'}")
        return lines
    dist = otel.get("configurator_distribution")
    lines.append(f"  NOTE    configurator: {name} (not ours{f', from {dist}' if dist else ''}: "
                 "stage tagging, the in-flight tracker and the live verdict are added to its "
                 "provider, but its exit is the SDK's own and drops are not counted); set "
                 f"{setting or 'OTEL_PYTHON_CONFIGURATOR=otel_ttft'}")
    return lines


def _env_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    """``otel-ttft doctor``'s own parser (the CLI hands it everything after ``doctor``)."""
    parser = argparse.ArgumentParser(
        prog="otel-ttft doctor", description=__doc__,
        usage="%(prog)s [--json] [--device DEVICE] [--env NAME=VALUE ...] [-- SERVE_ARGS...]")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--device", choices=runner_choice.devices(),
                        help="name the model runner vLLM would build on this platform (default: "
                             "this host's), e.g. cuda on a machine without a GPU")
    parser.add_argument("--env", action="append", type=_env_setting, default=[],
                        metavar="NAME=VALUE",
                        help="an environment variable as the server will have it, e.g. "
                             "VLLM_USE_V2_MODEL_RUNNER=0 (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(own)
    os.environ.update(dict(args.env))  # before vLLM is imported: vllm.envs reads them
    try:
        report = collect(args.device, serve_args)
    except runner_choice.RunnerChoiceError as exc:
        print(f"otel-ttft doctor: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    required = [h for h in report["hooks"]
                if not h["optional"] and h["target"].split(".", 1)[0] == "vllm"]
    if report["vllm"]["module_version"] is None or not any(h["resolved"] for h in required):
        print("otel-ttft doctor: nothing can be instrumented", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
