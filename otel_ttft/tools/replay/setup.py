"""What a replay run needs to be run again: recorded on its ``replay.run`` span
(``ttft.replay.setup``, JSON) so that ``otel-ttft verify`` can re-run a scenario with the same
models, prompts, sampling, client, concurrency, repeats, driver and command templates, changing
only what it verifies.

Templates are recorded as the driver expanded them (the LoRA and sleep-mode additions included),
with secrets redacted: the value after ``--api-key`` and any ``NAME=value`` whose name says key,
token, secret or password. A redacted template cannot be re-run; ``verify`` says so.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

SETUP_VERSION = 1
REDACTED = "<redacted>"
_SECRET_FLAGS = ("--api-key",)
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)", re.IGNORECASE)


def redact(template: str) -> str:
    """``template`` with secret values replaced by :data:`REDACTED` (tokens kept as they were
    otherwise, so a template without secrets comes back unchanged)."""
    try:
        tokens = shlex.split(template)
    except ValueError:
        return template
    out, hide_next, changed = [], False, False
    for token in tokens:
        name, eq, _ = token.partition("=")
        if hide_next:
            out.append(REDACTED)
            hide_next, changed = False, True
        elif name in _SECRET_FLAGS:
            if eq:
                out.append(f"{name}={REDACTED}")
                changed = True
            else:
                out.append(token)
                hide_next = True
        elif eq and not token.startswith("-") and _SECRET_NAME.search(name):
            out.append(f"{name}={REDACTED}")
            changed = True
        else:
            out.append(token)
    return " ".join(shlex.quote(t) for t in out) if changed else template


def is_redacted(template: str | None) -> bool:
    return bool(template) and REDACTED in template


def record(*, driver: str, scenarios: Sequence[str], repeat: int, repeat_warm: int,
           concurrency: int,
           max_tokens: int, seed: int, max_model_len: int, tokenizer: str | None,
           logprobs: int = 0,
           start_timeout_s: float, request_timeout_s: float, targets: Sequence[Any],
           adapters: dict[str, str | None], proxy_url: str | None, switch_ahead: bool = False,
           warm_prefix: bool = False) -> dict:
    """The replay's parameters; ``targets`` are the driver's :class:`Target` objects.
    ``switch_ahead`` / ``warm_prefix``: see ``replay.runner`` (absent in older records: off)."""
    return {
        "version": SETUP_VERSION, "driver": driver, "scenarios": list(scenarios),
        "repeat": repeat, "repeat_warm": repeat_warm, "concurrency": concurrency,
        "max_tokens": max_tokens, "seed": seed, "logprobs": logprobs,
        "max_model_len": max_model_len, "tokenizer": tokenizer,
        "start_timeout_s": start_timeout_s, "request_timeout_s": request_timeout_s,
        "proxy_url": proxy_url, "adapters": dict(adapters),
        "switch_ahead": switch_ahead, "warm_prefix": warm_prefix,
        "targets": [{"name": t.name, "model": t.model or None, "template": redact(t.template),
                     "url": t.url} for t in targets],
    }


def encode(setup: dict) -> str:
    return json.dumps(setup, sort_keys=True)
