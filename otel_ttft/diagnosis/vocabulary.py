"""The installed vLLM's own knobs, in its own words: its server flags (the argument parser ``vllm
serve`` builds), its environment variables (``vllm.envs.environment_variables``) and its loaders,
so that every change we print is named as the vLLM that will run it names it, never from a table
of ours. Also here: reading a server command template the way vLLM's parser would (which flags it
sets) and editing one.

Data only: the vocabulary is read once per vLLM version by a tool beside vLLM
(``otel_ttft.tools.vllm_vocabulary``) and shipped as JSON in this package
(``vocabulary_store``); the live verdict and ``otel-ttft analyze`` both build a
:class:`Vocabulary` from that JSON with :meth:`Vocabulary.from_json`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

# Tokens after which a server template's vLLM arguments start.
ENTRY_TOKENS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server", "serve")


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
    loader_packages: dict[str, bool | None] = field(default_factory=dict)
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
        """From the reader's JSON (``tools.vllm_vocabulary``). Its ``loader_packages`` is a
        mapping of name to installed or, as shipped, a list of names (installed: unknown)."""
        packages = data.get("loader_packages") or {}
        if not isinstance(packages, dict):
            packages = dict.fromkeys(packages)
        options = {flag: Option(flag, o["dest"], o["nargs"],
                                tuple(o["choices"]) if o.get("choices") is not None else None,
                                o.get("default"), bool(o.get("negative")))
                   for flag, o in data["options"].items()}
        return cls(data.get("vllm_version"), data.get("parser", "?"), options,
                   frozenset(data.get("env", ())), dict(data.get("env_defaults", {})),
                   tuple(data.get("load_formats", ())), packages,
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
