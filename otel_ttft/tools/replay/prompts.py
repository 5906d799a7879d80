"""The replay's fixed prompts: a short one, and a long one that fills the context up to the answer.

The long prompt is sized with the served model's own tokenizer and chat template, so that
prompt plus ``max_tokens`` fits the context limit with a small margin. Only token counts and
hashes are recorded; the text never leaves this process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

SHORT_TEXT = "Say hello in five words."
# Filler for the long prompt: plain words every tokenizer splits predictably.
_FILLER = ("the quick brown fox jumps over the lazy dog while the first token waits for the "
           "model to load and the cache to warm ")
MARGIN_TOKENS = 8  # room for the server's own special tokens
PROMPT_KINDS = ("short", "long")

TokenCounter = Callable[[str], int]  # chat-templated prompt text -> prompt tokens


class PromptError(ValueError):
    """The prompts cannot be built as asked (no tokenizer, context too small)."""


@dataclass(frozen=True)
class Prompt:
    kind: str  # short | long
    text: str
    tokens: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


@dataclass(frozen=True)
class PromptSet:
    short: Prompt
    long: Prompt

    def get(self, kind: str) -> Prompt:
        if kind not in PROMPT_KINDS:
            raise KeyError(kind)
        return self.short if kind == "short" else self.long

    def record(self) -> str:
        """``ttft.replay.prompts``: tokens and sha256 per prompt, never the text."""
        return json.dumps({p.kind: {"tokens": p.tokens, "sha256": p.sha256}
                           for p in (self.short, self.long)}, sort_keys=True)


def build_prompts(count: TokenCounter, max_model_len: int, max_tokens: int) -> PromptSet:
    """Short prompt as is; long prompt grown word by word (binary search) to the budget."""
    budget = max_model_len - max_tokens - MARGIN_TOKENS
    short_tokens = count(SHORT_TEXT)
    if budget <= short_tokens:
        raise PromptError(f"context limit {max_model_len} leaves no room for a long prompt "
                          f"with max_tokens {max_tokens}")
    words = _FILLER.split()

    def text(n: int) -> str:
        return " ".join(words[i % len(words)] for i in range(n))

    lo, hi = 1, 1
    while count(text(hi)) <= budget:  # exponential probe, then bisect
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            raise PromptError("the tokenizer never reaches the context limit")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(text(mid)) <= budget else (lo, mid)
    long_text = text(lo)
    return PromptSet(Prompt("short", SHORT_TEXT, short_tokens),
                     Prompt("long", long_text, count(long_text)))


def tokenizer_counter(tokenizer_path: str) -> TokenCounter:
    """Count prompt tokens as the server will: the model's tokenizer and chat template."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the user's input
        raise PromptError(f"cannot load a tokenizer from {tokenizer_path!r}: "
                          f"{type(exc).__name__}") from exc

    def count(text: str) -> int:
        messages = [{"role": "user", "content": text}]
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return len(ids)
        return len(tok(text)["input_ids"])

    return count
