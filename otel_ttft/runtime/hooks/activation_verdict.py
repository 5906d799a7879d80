"""Every activation explains itself: the verdict on a start, live, in the server that started.

When the API server is ready, its activation is compared with the earlier ones of the same model
and configuration on this host (``activation_history``), by the rule ``analyze`` applies
(``otel_ttft.diagnosis``): the earliest stage that expanded, by how much, and the change in the
running vLLM's own flags and environment variables. Once the activation's cold requests
(``OTEL_TTFT_COLD_REQUESTS``) are done it is judged again with their warm-up counted. Each verdict
goes on a short child span of the activation, ``vllm.activation.verdict`` (the activation span
has ended by then), into the server's log in plain words, and into the gauge.

Only measurement runs before ready: the history is read in a thread begun when the engine config
is known; the rule is imported and applied in a thread begun at ready, with vLLM's vocabulary as
the data shipped for its version (for a version with none, read once in a subprocess and kept on
disk; the verdict says so).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation

from otel_ttft import semconv
from otel_ttft.runtime import activation_history as history
from otel_ttft.runtime import (
    clock,
    compile_cache,
    environment_variables,
    history_storage,
    prefix_memory,
)
from otel_ttft.runtime.hooks import activation_ledger as ledger
from otel_ttft.runtime.hooks import verdict_report
from otel_ttft.runtime.hooks.verdict_report import config_summary  # noqa: F401
from otel_ttft.runtime.hooks.verdict_words import _report, attributes
from otel_ttft.runtime.telemetry import bounded_export, metrics, spans

logger = verdict_report.logger

#: how long the verdict's thread waits for the history read begun at ``note_config``
_HISTORY_WAIT_S = 30.0
#: how long reading a vLLM's vocabulary in a subprocess may take (a version with none shipped)
_VOCABULARY_READ_S = 300.0


@dataclass
class _Judged:
    """This process's activation under judgement: what ``on_ready`` knows at once, then what the
    verdict's thread adds (``done`` is set when it has)."""

    trace_hex: str
    span_context: Any
    start_ns: int
    end_ns: int
    pre: _Preload
    record: dict | None = None
    earlier: list[dict] = field(default_factory=list)
    vocab: Any = None
    vocab_error: str | None = None
    vocab_note: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cold_done: int = 0
    cold_ttft: float = 0.0
    cold_stages: dict[str, float] = field(default_factory=dict)
    #: prompt tokens of the cold requests that said how many came from the prefix cache, and those
    cold_prompt_tokens: int = 0
    cold_cached_tokens: int = 0
    #: the first request's TTFT and stages: what a forecast's first prefill rests on
    first: dict | None = None
    #: prompt tokens whose prefix warm requests found cached before this start, computed again,
    #: and which prefixes (their deepest known block): the ones worth warming
    cold_uncached_tokens: int = 0
    cold_prefixes: set[str] = field(default_factory=set)
    finished: bool = False
    saving: threading.Thread | None = None  # the save at ready: the one after cold waits for it


@dataclass
class _Preload:
    key: str
    config: dict
    model: str | None
    path: Path | None = None
    loaded: history.Loaded | None = None
    done: threading.Event = field(default_factory=threading.Event)
    prefix: prefix_memory.PrefixMemory | None = None
    #: the compile cache as this start found it, before it compiled
    compile_cache: compile_cache.CompileCacheState | None = None


PART = "verdict"


class LiveVerdict:
    """The ``verdict`` part (API server): the activation being judged, its cold requests, the
    latest verdict for the gauge. Made before the activation part, which tells it the engine
    config and ready; the request path tells it each finished request."""

    def __init__(self, process_state: Any):
        self._config = process_state.config
        self._tracer = process_state.tracer
        self._identity = process_state.identity
        self._preload: _Preload | None = None
        self._judged: _Judged | None = None
        self._latest: dict | None = None  # the gauge's observation: value and labels
        self._lock = threading.Lock()
        self._feed: Any = None  # the gauge's feed, once a verdict exists
        self._skews: list[tuple[float, dict]] = []  # the rank-skew gauge's observations
        self._skew_feed: Any = None
        self._closed = False
        self.prefix = prefix_memory.PrefixMemory()  # the prefix cache before this start
        self._prefix_activation: Any = None  # the activation ``prefix.before`` stands before
        bounded_export.before_exit_flush(self._save_prefixes)

    def note_config(self, vllm_config: Any) -> None:
        """The API server knows its engine config: start reading the history in a thread.
        Once per process."""
        if (self._closed or self._preload is not None or vllm_config is None
                or not history.enabled()):
            return
        try:
            summary = verdict_report.config_summary(vllm_config)
        except Exception:  # noqa: BLE001 - a config we cannot read: no verdict, no harm
            return
        self._preload = pre = _Preload(key=verdict_report.key(summary), config=summary,
                                       model=verdict_report.served_name(vllm_config))
        cache = getattr(vllm_config, "cache_config", None)
        if getattr(cache, "enable_prefix_caching", False):
            algo = str(getattr(cache, "prefix_caching_hash_algo", "") or "")
            self.prefix.configure(
                verdict_report.key({"model": summary.get("model_config.model", ""), "algo": algo,
                      "block_size": summary.get("cache_config.block_size", ""),
                      "vllm": summary.get("vllm.version", "")}),
                pre.model, algo, os.environ.get("PYTHONHASHSEED") is not None)
            pre.prefix = self.prefix
        threading.Thread(target=_load, args=(pre,), name="otel-ttft-verdict-history",
                         daemon=True).start()

    def wait_for_history(self, timeout_s: float) -> bool:
        """Whether the history read begun by ``note_config`` has finished (tests)."""
        pre = self._preload
        return pre is not None and pre.done.wait(timeout_s)

    def on_ready(self, root: trace.Span, start_ns: int, end_ns: int) -> None:
        """The API server is ready: judge this activation in a thread of its own, off the
        start-up path; then save its record."""
        pre = self._preload
        if self._closed or pre is None or not root.is_recording():
            return
        try:
            context = root.get_span_context()
            judged = _Judged(format(context.trace_id, "032x"), context, start_ns, end_ns, pre)
            self._judged = judged
            threading.Thread(target=self._judge_ready, args=(judged,), name="otel-ttft-verdict",
                             daemon=True).start()
        except Exception:  # noqa: BLE001 - the verdict must never cost the server its start
            logger.debug("otel-ttft: no verdict for this activation", exc_info=True)

    def _judge_ready(self, judged: _Judged) -> None:
        """The ready verdict, in its own thread: ``otel_ttft.diagnosis`` is imported here,
        never at start-up."""
        try:
            from otel_ttft.diagnosis import activation as diagnosis

            pre = judged.pre
            pre.done.wait(_HISTORY_WAIT_S)
            loaded = pre.loaded if pre.done.is_set() else None
            judged.record = _record(diagnosis, pre, judged.trace_hex, judged.start_ns,
                                    judged.end_ns)
            judged.earlier = sorted((r for r in (loaded.records if loaded else [])
                                     if r["key"] == pre.key), key=lambda r: r.get("at") or 0)
            if judged.earlier:  # a change to name: in the installed vLLM's words
                judged.vocab, judged.vocab_error, judged.vocab_note = _vocabulary()
            result = diagnosis.judge(judged.record, judged.earlier, vocab=judged.vocab,
                                     vocab_error=judged.vocab_error)
            if loaded is None or loaded.problem:
                result["history_problem"] = ("history not read in time" if loaded is None
                                             else loaded.problem)
            self._emit(result, judged)
            judged.saving = threading.Thread(target=_save, args=(pre.path, judged.record),
                                             name="otel-ttft-verdict-save", daemon=True)
            judged.saving.start()
        except Exception:  # noqa: BLE001 - never an error for the server
            logger.debug("otel-ttft: no verdict for this activation", exc_info=True)
        finally:
            judged.done.set()

    def prefix_seen(self, activation: Any, cold: bool, prompt_tokens: int | None,
                    cached_tokens: int | None, hashes: list[bytes],
                    tokens_per_hash: int) -> prefix_memory.Seen | None:
        """A request EngineCore shipped its prompt's block hashes for, after the fact: what it
        found cached joins the baseline; for a cold one, how much of its prompt had been cached
        before its activation (``None``: not measured). After a wake-up, the baseline is what
        this process's warm requests found before it slept."""
        if self._closed or not prompt_tokens or cached_tokens is None:
            return None
        memory = self.prefix
        if activation is not self._prefix_activation:
            self._prefix_activation = activation
            if getattr(activation, "kind", None) == "wake":
                memory.rebase()
        seen = memory.seen(hashes, tokens_per_hash, prompt_tokens) if cold else None
        memory.found_cached(hashes, tokens_per_hash, prompt_tokens, cached_tokens)
        return seen

    def _save_prefixes(self) -> None:
        problem = self.prefix.save()
        if problem:
            logger.debug("otel-ttft: prefix baseline not saved: %s", problem)

    def request_done(self, activation: Any, index: int, ttft_s: float | None,
                     stages: dict[str, float], warmup: Any = (), *,
                     prompt_tokens: int | None = None,
                     cached_tokens: int | None = None,
                     uncached_prefix_tokens: int = 0,
                     prefix: str | None = None) -> None:
        """A request finished (``index``: its place after its activation, 1 = first). Once
        the activation's cold requests are all done, judge it again with their warm-up
        counted, and with how much of their prompts vLLM's prefix cache held."""
        judged, cold = self._judged, self._config.cold_requests
        if (judged is None or judged.finished or not 0 < index <= cold
                or getattr(getattr(activation, "span_context", None), "trace_id", None)
                != judged.span_context.trace_id):
            return
        with self._lock:
            if judged.finished:
                return
            judged.cold_ttft += ttft_s or 0.0
            _add_request_stages(judged.cold_stages, stages, warmup)
            if index == 1:
                own: dict[str, float] = {}
                _add_request_stages(own, stages, warmup)
                judged.first = {"ttft_s": round(ttft_s or 0.0, 6),
                                "stages": {k: round(v, 6) for k, v in own.items()}}
            if prompt_tokens and cached_tokens is not None:
                judged.cold_prompt_tokens += prompt_tokens
                judged.cold_cached_tokens += min(cached_tokens, prompt_tokens)
            if uncached_prefix_tokens > 0:
                judged.cold_uncached_tokens += uncached_prefix_tokens
                if prefix is not None and len(judged.cold_prefixes) < 1024:
                    judged.cold_prefixes.add(prefix)
            judged.cold_done += 1
            if judged.cold_done < cold:
                return
            judged.finished = True
        threading.Thread(target=self._judge_cold, args=(judged,),
                         name="otel-ttft-verdict-cold", daemon=True).start()

    def _judge_cold(self, judged: _Judged) -> None:
        try:
            from otel_ttft.diagnosis import activation as diagnosis

            judged.done.wait(_HISTORY_WAIT_S + _VOCABULARY_READ_S)
            if judged.record is None:
                return  # no ready verdict: nothing to judge again
            cold: dict[str, Any] = {
                "requests": judged.cold_done, "ttft_s": round(judged.cold_ttft, 6),
                "stages": {k: round(v, 6) for k, v in judged.cold_stages.items()}}
            if judged.first is not None:
                cold["first"] = judged.first
            if judged.cold_prompt_tokens:
                cold.update(prompt_tokens=judged.cold_prompt_tokens,
                            cached_tokens=judged.cold_cached_tokens)
            before = judged.pre.prefix.before if judged.pre.prefix is not None else None
            if before is not None:  # measured against the warm requests before this start
                cold.update(uncached_prefix_tokens=judged.cold_uncached_tokens,
                            prefixes=len(judged.cold_prefixes),
                            warm_requests=before.requests,
                            warm_cached_share=round(before.cached_share or 0.0, 4))
                if judged.cold_uncached_tokens and judged.vocab is None \
                        and judged.vocab_error is None:  # the warm-up's route, in its words
                    judged.vocab, judged.vocab_error, judged.vocab_note = _vocabulary()
            record = dict(judged.record, cold=cold)
            result = diagnosis.judge(record, judged.earlier,
                                     phase=semconv.VERDICT_PHASE_COLD_REQUESTS,
                                     vocab=judged.vocab, vocab_error=judged.vocab_error)
            self._emit(result, judged)
            if judged.saving is not None:
                judged.saving.join(history.LOCK_WAIT_S + 5)  # in order: this replaces that
            _save(judged.pre.path, record)
            ledger.forget(judged.trace_hex)
            spans.flush_async(self._config)
        except Exception:  # noqa: BLE001
            logger.debug("otel-ttft: no cold-request verdict", exc_info=True)

    def _emit(self, result: dict, judged: _Judged) -> None:
        """One verdict: the log line, the gauge, then a child span of the activation (last: a
        reader that saw the span finds the line and the gauge there too)."""
        if self._closed:
            return
        if judged.vocab_note:
            result["vocabulary_note"] = judged.vocab_note
        # the log line and the gauges first, the span last: whoever sees the span finds them
        self._latest = _report(result, judged.trace_hex)
        self._note_skews(judged)
        if self._feed is None:
            self._feed = metrics.observable(
                self._config, semconv.METRIC_ACTIVATION_VERDICT, self._observe, unit="s",
                description="The blamed stage's increase over the earlier activations of its "
                            "model on this host, in this server's latest verdict (labels: "
                            "stage, fix, outcome)")
        now = clock.now_ns()
        parent = trace.set_span_in_context(trace.NonRecordingSpan(judged.span_context))
        spans.emit_span(semconv.SPAN_ACTIVATION_VERDICT, now, now, context=parent,
                        attributes=attributes(result), tracer=self._tracer,
                        identity=self._identity)

    def _note_skews(self, judged: _Judged) -> None:
        """The rank-skew gauge: each stage's skew among the workers in this activation."""
        found = (judged.record or {}).get("ranks") or {}
        skews = found.get("skews") if isinstance(found, dict) else None
        if not skews:
            return
        model = judged.pre.model
        self._skews = [(float(v["skew_s"]), {
            semconv.ATTR_STAGE: stage, semconv.ATTR_PARALLEL_RANK: int(v["rank"]),
            **({semconv.GEN_AI_REQUEST_MODEL: model} if model else {})})
            for stage, v in skews.items()]
        if self._skew_feed is None:
            self._skew_feed = metrics.observable(
                self._config, semconv.METRIC_ACTIVATION_RANK_SKEW, self._observe_skews,
                unit="s", description="In this server's latest activation, per start-up stage: "
                                      "the slowest worker rank's time less the fastest's "
                                      "(label ttft.parallel.rank: the slowest)")

    def _observe_skews(self, options: CallbackOptions):
        for value, labels in list(self._skews):
            yield Observation(value, labels)

    def _observe(self, options: CallbackOptions):
        latest = self._latest
        if latest is not None:
            yield Observation(latest["value"], latest["labels"])

    def close(self) -> None:
        """Judge nothing more; the gauge stops reporting this process's verdict."""
        self._closed = True
        bounded_export.forget_before_exit_flush(self._save_prefixes)
        if self._feed is not None:
            metrics.stop_feeding(self._feed, self._observe)
            self._feed = None
        if self._skew_feed is not None:
            metrics.stop_feeding(self._skew_feed, self._observe_skews)
            self._skew_feed = None
        self._skews = []
        self._preload = self._judged = self._latest = None


def _load(pre: _Preload) -> None:
    try:
        try:
            import vllm.envs as envs

            root = str(envs.VLLM_CACHE_ROOT)
        except Exception:  # noqa: BLE001 - no vLLM cache root: only an explicit path
            root = None
        if root:  # before this start compiles: what the compile will find
            pre.compile_cache = compile_cache.inspect(root)
        pre.path = history.default_path(root)
        pre.loaded = history.load(pre.path) if pre.path else history.Loaded(
            problem="no history path (VLLM_CACHE_ROOT unknown)", ours=False)
        if pre.prefix is not None and pre.path is not None:
            pre.prefix.load(prefix_memory.path_beside(pre.path))
        if pre.path and not pre.loaded.records and pre.loaded.problem is None:
            pre.loaded.problem = history_storage.lost_note(pre.path)  # a container's own disk
    except Exception as exc:  # noqa: BLE001 - never an error for the server
        pre.loaded = history.Loaded(problem=f"history not read: {type(exc).__name__}")
    finally:
        pre.done.set()


def _vocabulary() -> tuple[Any, str | None, str | None]:
    """The running vLLM's vocabulary, ``(vocabulary, error, note)``: shipped for its version,
    else read once by the reader tool in a subprocess of this interpreter, kept on disk."""
    from otel_ttft.diagnosis import vocabulary_store as store

    return store.in_server(sys.executable,
                           os.environ.get(environment_variables.OTEL_TTFT_CACHE),
                           _VOCABULARY_READ_S)


def _record(diagnosis: Any, pre: _Preload, trace_hex: str, start_ns: int, end_ns: int) -> dict:
    from otel_ttft.diagnosis import ranks

    part = ledger.gather(trace_hex)
    stages = diagnosis.stage_seconds(part["intervals"], start_ns, end_ns)
    skews = ranks.skews(part["ranked"])
    ratio = part["resident_ratio"]
    storage = part["shard_bytes"] * (1.0 - ratio) if ratio is not None else part["shard_bytes"]
    hits = part["compile_hits"]
    facts = dict(part["facts"])
    if pre.compile_cache is not None:  # what the compile found, for the fix to say
        facts["compile_cache"] = pre.compile_cache.summary(facts.get("compile_cache_dir"))
    if part.get("shard_paths"):
        facts["shard_paths"] = part["shard_paths"]
    return {
        "id": trace_hex, "key": pre.key, "model": pre.model, "kind": "start",
        "at": round(time.time(), 3), "started_at": round(start_ns / 1e9, 3),
        "duration_s": round((end_ns - start_ns) / 1e9, 6),
        "stages": {k: round(v, 6) for k, v in stages.items()},
        "evidence": {"bytes_read": int(storage), "shard_bytes": int(part["shard_bytes"]),
                     "page_cache_resident_ratio": ratio,
                     "compile_cache_hit": all(hits) if hits else None,
                     "compile_cache_dir": facts.get("compile_cache_dir")},
        "facts": facts, "config": pre.config,
        "ranks": {"gate": ranks.gate(part["ranked"]), "skews": skews} if skews else None,
    }


def _save(path: Path | None, record: dict) -> None:
    if path is None:
        return
    problem = history.save(path, record)
    if problem:
        logger.debug("otel-ttft: activation history not saved: %s", problem)


def _add_request_stages(into: dict[str, float], stages: dict[str, float], warmup: Any) -> None:
    """A request's TTFT stages, its warm-up work (first use, a compile, an adapter load) taken
    out of the stage it happened in (front end; prefill) and named as the warm-up it was."""
    own = {k: v for k, v in stages.items() if k != semconv.STAGE_FIRST_DECODE}
    for item in warmup or ():
        try:
            _name, stage, start, end, _attrs = item
            seconds = max(float(end) - float(start), 0.0)
        except (TypeError, ValueError):
            continue
        host = (semconv.STAGE_FRONTEND if stage == semconv.STAGE_WARMUP_FIRST_USE
                else semconv.STAGE_PREFILL)
        taken = min(seconds, own.get(host, 0.0))
        own[host] = own.get(host, 0.0) - taken
        own[stage] = own.get(stage, 0.0) + taken
    for k, v in own.items():
        into[k] = into.get(k, 0.0) + v
