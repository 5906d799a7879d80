"""What one verdict's change is computed from (:class:`Evidence`), and the collector that checks
every name a candidate prints against the installed vLLM's vocabulary (:class:`Builder`); the
rules themselves are in ``change_rules``."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from otel_ttft.diagnosis import vocabulary as knobs

SIDE_SERVER, SIDE_DRIVER, SIDE_CLIENT = "server", "driver", "client"
FILL_CACHE = "fill-cache"
#: prepare: after each activation, one untimed request as users send it (the shared prefix,
#: their sampling options) before users arrive
WARM_PREFIX = "warm-prefix"
CHAT_ROUTE = "/v1/chat/completions"  # looked up in vLLM's own routes, never assumed


def median(values: Iterable[float]) -> float:
    """The median, 0 for none."""
    values = list(values)
    return statistics.median(values) if values else 0.0


class Evidence:
    """What one verdict's change is computed from."""

    def __init__(self, verdict: dict, rows: list[dict], base_rows: list[dict], run: dict,
                 activations: Sequence[Any], vocab: knobs.Vocabulary | None):
        self.verdict = verdict
        self.rows, self.base_rows = rows, base_rows
        self.run = run or {}
        self.setup = self.run.get("setup") or {}
        self.vocab = vocab
        models = [r["model"] for r in rows if r.get("model")]
        self.model = max(set(models), key=models.count) if models else None
        self.targets = {t.get("name"): t for t in self.setup.get("targets") or []
                        if isinstance(t, dict) and t.get("name")}
        self.target_name = self._target_of(self.model)
        self.facts = {name: self._facts(activations, name) for name in
                      {*self.targets, self.model} if name}
        template = (self.targets.get(self.target_name) or {}).get("template")
        self.server = None
        if template and vocab is not None:
            try:
                self.server = knobs.TemplateArgs(template, vocab)
            except ValueError:
                self.server = None

    def _target_of(self, model: str | None) -> str | None:
        if model in self.targets:
            return model
        adapters = self.setup.get("adapters") or {}
        if model in adapters and self.targets:
            return next(iter(self.targets))  # adapters are served by model A's server
        return model

    @staticmethod
    def _facts(activations: Sequence[Any], model: str) -> dict:
        out: dict[str, Any] = {}
        for act in activations:
            if act.model != model:
                continue
            for key, value in act.facts.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[key] = max(out.get(key, value), value)
                else:
                    out.setdefault(key, value)
            out["bytes_read"] = max(out.get("bytes_read", 0), act.bytes_read or 0)
        return out

    @property
    def own(self) -> dict:
        return self.facts.get(self.target_name) or self.facts.get(self.model) or {}

    @property
    def substage(self) -> str:
        return self.verdict.get("substage") or self.verdict.get("stage") or ""

    def p50(self, key: str, rows: list[dict] | None = None) -> float:
        rows = self.rows if rows is None else rows
        return median((r.get("substages") or {}).get(key, (r.get("stages") or {}).get(key, 0.0))
                       for r in rows)

    @property
    def concurrency(self) -> int:
        c = self.run.get("concurrency")
        if isinstance(c, int) and c > 0:
            return c
        waiting = [r.get("waiting_at_arrival") for r in self.rows
                   if isinstance(r.get("waiting_at_arrival"), int)]
        return max(waiting, default=0) + 1

    @property
    def max_tokens(self) -> int:
        sampling = self.run.get("sampling")
        if isinstance(sampling, dict) and isinstance(sampling.get("max_tokens"), int):
            return sampling["max_tokens"]
        return int(self.setup.get("max_tokens") or 16)

    @property
    def prompt_tokens(self) -> int:
        return int(median(r["prompt_tokens"] for r in self.rows if r.get("prompt_tokens")))

    def template_value(self, dest: str) -> Any:
        return self.server.get(dest) if self.server is not None else None


class Builder:
    """Collects one verdict's candidates, checking every name against the vocabulary."""

    def __init__(self, ev: Evidence):
        self.ev = ev
        self.candidates: list[dict] = []

    def add(self, cid: str, reason: str, *, side: str = SIDE_SERVER, args: Sequence[str] = (),
            env: dict[str, str] | None = None, durable: Sequence[str] = (),
            driver: str | None = None, models: Sequence[str] | None = None,
            prepare: str | None = None, gpu_only: bool = False,
            sleep_level: int | None = None, stage: str | None = None) -> dict:
        vocab = self.ev.vocab
        missing = []
        if vocab is not None:
            missing += [a.partition("=")[0] for a in args
                        if a.startswith("--") and not vocab.has_flag(a.partition("=")[0])]
            missing += [n for n in env or {} if not vocab.has_env(n)]
            if prepare == WARM_PREFIX and vocab.routes and CHAT_ROUTE not in vocab.routes:
                missing.append(CHAT_ROUTE)  # the warm-up is a chat turn
        replaces = {}
        server = self.ev.server
        if server is not None and vocab is not None:
            for a in args:
                dest = vocab.dest(a.partition("=")[0]) if a.startswith("--") else None
                if dest and server.sets(dest):  # the template's own words for the setting
                    start, end = server.spans[dest][-1]
                    replaces[a.partition("=")[0]] = " ".join(server.tokens[start:end])
        if models is None:
            models = [self.ev.target_name] if self.ev.target_name else []
        candidate = {
            "id": cid, "recommendation": self.ev.verdict.get("recommendation"), "side": side,
            "models": list(models), "args": list(args), "env": dict(env or {}),
            "durable": list(durable), "driver": driver, "sleep_level": sleep_level,
            "prepare": prepare, "gpu_only": gpu_only, "missing": missing,
            "replaces": replaces, "reason": reason,
            # the (sub-)stage it is meant to shrink, what verify judges it by
            "stage": stage or self.ev.verdict.get("substage") or self.ev.verdict.get("stage"),
        }
        self.candidates.append(candidate)
        return candidate
