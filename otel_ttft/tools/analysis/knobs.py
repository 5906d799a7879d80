"""The installed vLLM's own knobs: its server flags (the argument parser ``vllm serve`` builds), its
environment variables (``vllm.envs.environment_variables``) and its loaders, so that every change
we print is named in the words of the vLLM that will run it, never from a table of ours.

They come from the data shipped in the package for the installed vLLM's version
(``otel_ttft.diagnosis.vocabulary_store``); for a vLLM with none shipped, the reader
(``otel_ttft.tools.vllm_vocabulary``) runs once in a subprocess (importing vLLM takes 10-60 s) and
its answer is kept under ``$OTEL_TTFT_CACHE``, keyed by vLLM's version and the files it came from.
Where vLLM is not installed there is no vocabulary and the changes say so instead of guessing.

What the knobs are and how a server template is read and edited live in
``otel_ttft.diagnosis.vocabulary`` (the runtime's live verdict names its fix with the same code);
they are re-exported here for ``change`` and ``verify``.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from otel_ttft.diagnosis import vocabulary_store as store
from otel_ttft.diagnosis.vocabulary import (
    ENTRY_TOKENS,
    Option,
    TemplateArgs,
    Vocabulary,
    edit_template,
)
from otel_ttft.runtime import environment_variables
from otel_ttft.tools import vllm_vocabulary

__all__ = ["ENTRY_TOKENS", "KnobsUnavailable", "Option", "TemplateArgs", "Vocabulary",
           "edit_template", "probe", "try_vocabulary", "vocabulary"]

PROBE_TIMEOUT_S = 600.0
KnobsUnavailable = store.VocabularyUnavailable


def cache_dir() -> Path:
    """Where vocabularies read on first use are kept (``$OTEL_TTFT_CACHE/vllm-knobs``)."""
    return store.cache_dir(os.environ.get(environment_variables.OTEL_TTFT_CACHE))


def _argv(python: str) -> list[str]:
    """The reader by its source text: it imports nothing of ours, so it runs in an interpreter
    where otel_ttft is not installed."""
    source = Path(vllm_vocabulary.__file__).read_text(encoding="utf-8")
    return [python, "-c", source, "--json-line"]


def probe(python: str = sys.executable, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """Read the vocabulary in a fresh interpreter; its JSON, or :class:`KnobsUnavailable`."""
    return store.probe(_argv(python), timeout_s)


@functools.cache
def loaded(python: str = sys.executable) -> store.Loaded:
    """The installed vLLM's knobs and where they came from (shipped, cached or read now)."""
    root = store.vllm_dir() if python == sys.executable else None
    if python == sys.executable and root is None:
        raise KnobsUnavailable("vLLM is not installed in this environment")
    version = store.installed_version() if python == sys.executable else None
    cache = store.cache_file(cache_dir(), python, root) if root is not None else None
    return store.load(version, argv=_argv(python), cache=cache, timeout_s=PROBE_TIMEOUT_S)


def vocabulary(python: str = sys.executable) -> Vocabulary:
    """The installed vLLM's knobs (shipped for its version, else read once and kept on disk)."""
    return loaded(python).vocabulary


def try_vocabulary() -> tuple[Vocabulary | None, str | None]:
    """``(vocabulary, None)`` or ``(None, why not)``."""
    try:
        return vocabulary(), None
    except KnobsUnavailable as exc:
        return None, str(exc)
