"""The replay's fixed prompts, shaped as users send them to a server with vLLM's default prefix
caching on.

- ``short``: a chat turn. A long shared prefix (a system prompt and a few turns of history, the
  same in every request) and a short question that differs per request. A warm server reads the
  prefix from its prefix cache; a server the switch left cold computes it again.
- ``long``: one user message that fills the context up to the answer, headed by the request's
  number, so that no two requests share a prefix: its repeats measure long-prompt prefill, never
  the cache.
- ``probe``: a short question with no shared prefix, for requests that warm a server's process
  without warming its prefix cache (what health checks and other clients send).

Sizes come from the served model's own tokenizer and chat template: ``short`` takes
``CHAT_SHARE`` of the room left by ``max_tokens``, ``long`` all of it (less a small margin).
A request's number changes its token count by a few at most.
Only token counts and hashes are recorded; the text never leaves this process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

SHORT_TEXT = "Say hello in five words."  # the probe, and the question of every chat turn
SYSTEM_TEXT = ("You are the assistant of a team that serves language models. Answer in plain "
               "words, briefly, and say when you do not know.")
# Filler for the history and the long prompt: plain words every tokenizer splits predictably.
_FILLER = ("the quick brown fox jumps over the lazy dog while the first token waits for the "
           "model to load and the cache to warm ")
NUMBER_DIGITS = 8  # a request's number, fixed width
_SAMPLE_NUMBERS = (0, 1, 12345678, 50505050, 10 ** NUMBER_DIGITS - 1)
MARGIN_TOKENS = 8  # room for the server's own special tokens
CHAT_SHARE = 0.6  # of the prompt budget, for the chat turn (its prefix: most of it)
PROMPT_KINDS = ("short", "long")
_NUMBER = "{n}"

Messages = list[dict[str, str]]
TokenCounter = Callable[[Messages], int]  # chat messages -> prompt tokens, chat template applied


class PromptError(ValueError):
    """The prompts cannot be built as asked (no tokenizer, context too small)."""


@dataclass(frozen=True)
class Prompt:
    """One kind of prompt: ``shared`` messages every request of the kind starts with, then one
    user message, ``text``, where ``{n}`` becomes the request's number."""

    kind: str  # short | long | probe
    text: str
    tokens: int  # prompt tokens of a request, at most (chat template applied)
    shared: tuple[tuple[str, str], ...] = ()  # (role, content), the same in every request
    shared_tokens: int = 0  # prompt tokens of the shared messages alone

    @property
    def sha256(self) -> str:
        return hashlib.sha256(json.dumps([self.shared, self.text]).encode()).hexdigest()

    def messages(self, n: int = 0) -> Messages:
        number = f"{n % 10 ** NUMBER_DIGITS:0{NUMBER_DIGITS}d}"
        return [*({"role": role, "content": content} for role, content in self.shared),
                {"role": "user", "content": self.text.replace(_NUMBER, number)}]


@dataclass(frozen=True)
class PromptSet:
    short: Prompt
    long: Prompt
    probe: Prompt

    def get(self, kind: str) -> Prompt:
        if kind not in PROMPT_KINDS:
            raise KeyError(kind)
        return self.short if kind == "short" else self.long

    def record(self) -> str:
        """``ttft.replay.prompts``: per kind its tokens, the tokens every request of it shares
        and a sha256 of its text, never the text."""
        return json.dumps({p.kind: {"tokens": p.tokens, "shared_prefix_tokens": p.shared_tokens,
                                    "sha256": p.sha256}
                           for p in (self.short, self.long)}, sort_keys=True)


def _largest(fits: Callable[[int], bool]) -> int:
    """The largest n >= 0 with ``fits(n)`` (``fits`` falls once and stays false)."""
    lo, hi = 0, 1
    while fits(hi):  # exponential probe, then bisect
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            raise PromptError("the tokenizer never reaches the context limit")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def build_prompts(count: TokenCounter, max_model_len: int, max_tokens: int) -> PromptSet:
    """The chat turn's history and the long prompt grown word by word (binary search) to their
    budgets; the same every run for the same tokenizer and limits."""
    budget = max_model_len - max_tokens - MARGIN_TOKENS
    words = _FILLER.split()

    def filler(n: int) -> str:
        return " ".join(words[i % len(words)] for i in range(n))

    def history(n: int) -> tuple[tuple[str, str], ...]:
        """A system prompt, then turns of about ``n`` words in all."""
        turns, per = [("system", SYSTEM_TEXT)], 40
        for i in range(0, n, per):
            turns.append(("user" if (i // per) % 2 == 0 else "assistant",
                          filler(min(per, n - i))))
        if turns[-1][0] == "user":  # the next user message is the request's own
            turns.append(("assistant", "Noted."))
        return tuple(turns)

    question = f"Question {_NUMBER}: {SHORT_TEXT}"

    def most(prompt: Prompt) -> int:
        """The most tokens a request of ``prompt`` takes: numbers tokenize unevenly."""
        return max(count(prompt.messages(n)) for n in _SAMPLE_NUMBERS)

    def chat(n: int) -> Prompt:
        return Prompt("short", question, 0, history(n))

    probe_tokens = count(Prompt("probe", SHORT_TEXT, 0).messages())
    chat_budget = int(CHAT_SHARE * budget)
    if chat_budget <= most(chat(0)):
        raise PromptError(f"context limit {max_model_len} leaves no room for a shared prefix "
                          f"and a long prompt with max_tokens {max_tokens}")
    n = _largest(lambda n: most(chat(n)) <= chat_budget)
    shared = history(n)
    short = Prompt("short", question, most(chat(n)), shared,
                   count([{"role": r, "content": c} for r, c in shared]))

    head = f"{_NUMBER} is this ticket's number. "  # first: no two long prompts share a prefix
    n = _largest(lambda n: most(Prompt("long", head + filler(n), 0)) <= budget)
    text = head + filler(n)
    long = Prompt("long", text, most(Prompt("long", text, 0)))
    return PromptSet(short, long, Prompt("probe", SHORT_TEXT, probe_tokens))


def tokenizer_counter(tokenizer_path: str) -> TokenCounter:
    """Count prompt tokens as the server will: the model's tokenizer and chat template."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the user's input
        raise PromptError(f"cannot load a tokenizer from {tokenizer_path!r}: "
                          f"{type(exc).__name__}") from exc

    def count(messages: Messages) -> int:
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return len(ids)
        return len(tok(" ".join(m["content"] for m in messages))["input_ids"])

    return count
