"""Is this process one of vLLM's? Decided from its command line, before anything else of ours
loads, so that the helpers a server starts carry nothing of ours.

``opentelemetry-instrument`` runs its ``sitecustomize`` in every Python process that inherits the
environment: vLLM's API server, EngineCore and workers, but also multiprocessing's resource
tracker, torch Inductor's compile workers, ``python -c`` probes. The interpreter's own command line
(``sys.orig_argv``) is all that is certain at that point, and it gives three answers:

- ``VLLM``: ``-m vllm...`` or the ``vllm`` console script: instrument now, as before;
- ``HELPER``: a process known never to be vLLM's (:data:`HELPER_CODE`, :data:`HELPER_MODULES`,
  :data:`HELPER_SCRIPTS`): nothing of ours, ever;
- ``UNDECIDED``: anything else (multiprocessing's spawn children, which is what EngineCore and the
  workers are; a user's ``python myscript.py`` that runs ``LLM(...)``): our part runs when, and
  only if, the ``vllm`` package is imported (a post-import hook, :func:`when_vllm`). vLLM's spawn
  children import ``vllm`` first thing (the parent's main module, the function they run) before
  any of vLLM's code runs.

This module imports only the standard library; ``wrapt`` (already loaded by
``opentelemetry-instrument``) only for an undecided process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

logger = logging.getLogger("otel_ttft")

VLLM, HELPER, UNDECIDED = "vllm", "helper", "undecided"

#: ``python -c`` code that starts these is a helper (multiprocessing's resource tracker)
HELPER_CODE = ("from multiprocessing.resource_tracker import",)
#: ``python -m`` modules that are helpers: vLLM's model-inspection subprocess, Inductor's workers
HELPER_MODULES = ("vllm.model_executor.models.registry", "torch._inductor.compile_worker")
#: scripts (path endings) that are helpers: Inductor's compile-worker pool
HELPER_SCRIPTS = ("torch/_inductor/compile_worker/__main__.py",)

_WITH_VALUE = frozenset("WX")  # options whose value follows: -W arg, -X opt


def command(orig_argv: Sequence[str]) -> tuple[str, str]:
    """What the interpreter runs: ``("-c", code)``, ``("-m", module)``, ``("script", path)``,
    or ``("", "")`` (interactive, stdin), from its full command line (``sys.orig_argv``)."""
    args = list(orig_argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return ("script", args[i + 1]) if i + 1 < len(args) else ("", "")
        if arg.startswith("--"):  # --check-hash-based-pycs MODE; --version, --help...
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if not arg.startswith("-") or arg == "-":
            return ("script", arg) if arg != "-" else ("", "")
        for j, flag in enumerate(arg[1:], start=1):  # a cluster: -Bc 'code', -uWignore
            if flag in "cm":
                value = arg[j + 1:] or (args[i + 1] if i + 1 < len(args) else "")
                return f"-{flag}", value
            if flag in _WITH_VALUE:
                i += 0 if arg[j + 1:] else 1  # -Wignore, or -W ignore
                break
        i += 1
    return "", ""


def classify(orig_argv: Sequence[str] | None = None) -> str:
    """``VLLM``, ``HELPER`` or ``UNDECIDED`` for this process (or the command line given)."""
    kind, value = command(sys.orig_argv if orig_argv is None else orig_argv)
    if kind == "-m":
        if any(value == m or value.startswith(m + ".") for m in HELPER_MODULES):
            return HELPER
        return VLLM if value == "vllm" or value.startswith("vllm.") else UNDECIDED
    if kind == "-c":
        return HELPER if value.lstrip().startswith(HELPER_CODE) else UNDECIDED
    if kind == "script":
        path = value.replace(os.sep, "/")
        if path.endswith(HELPER_SCRIPTS):
            return HELPER
        return VLLM if os.path.basename(path) == "vllm" else UNDECIDED
    return UNDECIDED


def when_vllm(action: Callable[[], None], what: str) -> None:
    """Run ``action`` in vLLM's processes only: now where the command line says vLLM (its
    failure propagates, as before), never in a helper, and in an undecided process once ``vllm``
    is imported (then a failure is logged: it must never fail vLLM's own import)."""
    verdict = classify()
    if verdict == HELPER:
        return
    if verdict == VLLM:
        action()
        return

    def on_import(_module: object) -> None:
        try:
            action()
        except Exception:  # noqa: BLE001 - never break ``import vllm``
            logger.warning("otel-ttft: %s failed on vLLM's import; vLLM runs without it", what,
                           exc_info=True)

    import wrapt

    wrapt.register_post_import_hook(on_import, "vllm")  # now, if vllm is imported already
