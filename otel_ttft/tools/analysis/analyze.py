"""`otel-ttft analyze`: traces in, the per-request stage breakdown and the verdicts out.

The result is the versioned ``otel-ttft/analysis/v1`` document (docs/analysis.md): the
intermediate result (every request's stages, sub-stages and evidence) stays inspectable before
the verdicts that are drawn from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from otel_ttft import semconv
from otel_ttft.diagnosis import prefix
from otel_ttft.runtime import environment_variables as env
from otel_ttft.tools.analysis import activations, breakdown, change, forecast_check, verdict
from otel_ttft.tools.analysis.breakdown import PIPELINE, Collected, RequestSummary

SCHEMA = "otel-ttft/analysis/v1"
_NS = 1e9
WARM, FIRST = "warm", "first"


class AnalysisError(ValueError):
    """The traces cannot be analyzed as asked (mixed client settings, unknown baseline, ...)."""


def scenario_of(request: RequestSummary) -> str:
    """The replay's scenario; for traffic not sent by the replay, the model and whether the
    request was the first after an activation (or waited for warm-up work) or a warm one."""
    if request.scenario:
        return request.scenario
    model = os.path.basename((request.model or "unknown").rstrip("/")) or request.model
    return f"{model}:{FIRST if request.first_after_activation else WARM}"


def default_baseline(scenario: str, scenarios: Iterable[str]) -> str | None:
    names = set(scenarios)
    if semconv.SCENARIO_SHORT_PROMPT in names:
        return semconv.SCENARIO_SHORT_PROMPT
    model = scenario.rsplit(":", 1)[0]
    warm = f"{model}:{WARM}"
    return warm if warm in names else None


def analyze(collected: Collected, *, baseline: str | None = None, run_id: str | None = None,
            source: str = "", segments: bool = True, changes: bool = True) -> dict:
    """The analysis document for everything collected (one replay run, or live traffic).
    ``segments=False`` leaves out each request's ``segments`` (the tiling the HTML report
    draws): the terminal table does not need them, and over 100,000 requests they are most of
    the memory. ``changes=False`` leaves out each verdict's ``change`` (``verify`` computes
    verdicts of its own re-runs, whose changes it does not need)."""
    runs = collected.runs
    if run_id is not None:
        if run_id not in runs:
            raise AnalysisError(f"no replay run {run_id!r} in the source (runs: "
                                f"{', '.join(sorted(runs)) or 'none'})")
        runs = {run_id: runs[run_id]}
    settings = {r.client_settings() for r in runs.values()}
    if len(settings) > 1:
        raise AnalysisError(
            f"{len(runs)} replay runs with different client settings (client, sampling, "
            f"concurrency or prompts) cannot be compared; pick one with --run "
            f"({', '.join(sorted(runs))})")
    # A replay's own warm-up requests (and other traffic) are not part of its scenarios.
    replayed = bool(runs) or any(r.scenario for r in collected.requests)
    requests = [r for r in collected.requests
                if (run_id is None or r.run_id == run_id) and (r.scenario or not replayed)]
    ignored = len(collected.requests) - len(requests)
    records, errors = [], []
    for request in sorted(requests, key=lambda r: r.start_ns):
        if request.error is not None:
            errors.append({"trace_id": request.trace_id, "scenario": scenario_of(request),
                           "model": request.model, "error": request.error})
            continue
        records.append(request_record(request, collected, segments=segments,
                                      cold_requests=_cold_requests(runs, request)))
    names = list(dict.fromkeys(r["scenario"] for r in records))
    bases = {}
    for name in names:
        base = baseline or default_baseline(name, names)
        if base is not None and baseline is not None and base not in names:
            raise AnalysisError(f"baseline scenario {base!r} not found (scenarios: "
                                f"{', '.join(summarize(records))})")
        if base is not None and base != name:
            bases[name] = base
    # Prefill of prompt tokens the baseline found in the prefix cache: its own sub-stage.
    by_scenario = {name: [r for r in records if r["scenario"] == name] for name in names}
    for name, base in bases.items():
        rows, base_rows = by_scenario[name], by_scenario[base]
        if not replayed:  # live traffic: each model's first requests against its warm ones
            rows, base_rows = _live_labels(rows), _live_labels(base_rows)
        split = iter(_unlabelled(r) for r in prefix.split(rows, base_rows))
        records = [next(split) if r["scenario"] == name else r for r in records]
    scenarios = summarize(records)
    verdicts = []
    for name in scenarios:
        if name not in bases:
            continue
        rows = [r for r in records if r["scenario"] == name]
        base_rows = [r for r in records if r["scenario"] == bases[name]]
        verdicts.append(verdict.verdict(name, bases[name], rows, base_rows))
    run = next(iter(runs.values())).as_dict() if runs else {
        "run_id": None, "client": None, "sampling": None, "concurrency": None, "prompts": None,
        "driver": None, "models": sorted({r["model"] for r in records if r["model"]}),
        "repeat": None, "repeat_warm": None, "cold_requests": None}
    doc = {"schema": SCHEMA, "source": source, "run": run, "requests": records,
           "errors": errors, "ignored_requests": ignored, "scenarios": scenarios,
           "baseline": baseline or (semconv.SCENARIO_SHORT_PROMPT
                                    if semconv.SCENARIO_SHORT_PROMPT in scenarios else None),
           "verdicts": verdicts,
           # starts along their slowest worker rank: the ones a rank gated
           "gated_activations": activations.gated(collected.activations)}
    if changes:
        change.attach(doc, collected.activations)  # each verdict's concrete change
    return doc


LIVE_PROMPT = "live traffic"


def _live_labels(rows: list[dict]) -> list[dict]:
    """Live requests carry no replay prompt label: one label for all of a model's, so their
    cached share is compared with its warm requests'. A request the server already split (its
    span carries ``prefill.uncached_prefix``, measured against the warm requests before the
    activation) is not split again."""
    return [r if r.get("prompt") is not None
            or prefix.UNCACHED in r["substages"] else {**r, "prompt": LIVE_PROMPT}
            for r in rows]


def _unlabelled(row: dict) -> dict:
    return {**row, "prompt": None} if row.get("prompt") == LIVE_PROMPT else row


def _cold_requests(runs: dict, request: RequestSummary) -> int:
    """How many requests after an activation its server counts as cold: what the replay run
    warmed for, else the default."""
    run = runs.get(request.run_id) if request.run_id else None
    count = run.cold_requests if run is not None else None
    return count if isinstance(count, int) and count >= 0 else env.DEFAULT_COLD_REQUESTS


def request_record(request: RequestSummary, collected: Collected, *,
                   segments: bool = True,
                   cold_requests: int = env.DEFAULT_COLD_REQUESTS) -> dict:
    activation = breakdown.join_activation(request, collected.activations)
    switches = breakdown.join_switches(request, collected.switches)
    tiles = breakdown.tile_request(request, activation, switches)
    stages = dict.fromkeys(PIPELINE, 0.0)
    substages: dict[str, float] = {}
    for start, end, stage in tiles:
        seconds = (end - start) / _NS
        family = stage.partition(".")[0]
        stages[family] = stages.get(family, 0.0) + seconds
        substages[stage] = substages.get(stage, 0.0) + seconds
    hits = [h for h in (activation.compile_cache_hit if activation else None,
                        request.compile_cache_hit) if h is not None]
    record = {
        "trace_id": request.trace_id,
        "scenario": scenario_of(request),
        "model": request.model,
        "prompt": request.prompt,
        "repeat_index": request.repeat_index,
        "prompt_tokens": request.prompt_tokens,
        "client_ttft_s": round(request.client_ttft_s, 6),
        "server_ttft_s": None if request.server_ttft_s is None else round(request.server_ttft_s, 6),
        "stages": {k: round(v, 6) for k, v in stages.items()},
        "substages": {k: round(v, 6) for k, v in sorted(substages.items()) if v > 0},
        "evidence": {
            "bytes_read": activation.bytes_read if activation else 0,
            "page_cache_resident_ratio": activation.resident_ratio if activation else None,
            "compile_cache_hit": all(hits) if hits else None,
            "model_was_resident": activation is None and not switches,
        },
        "activation_trace_id": activation.trace_id if activation else None,
        "waiting_at_arrival": request.waiting_at_arrival,
    }
    early = (None if request.activation_index is None
             else request.activation_index <= cold_requests)
    for key, value in (("activation_index", request.activation_index),
                       ("among_first_requests", early),
                       ("evicted_resident_ratio", request.evicted_resident),
                       ("evicted_cold", request.evicted_cold),
                       ("cached_tokens", request.cached_tokens)):
        if value is not None:  # measured: the server's cold count, the replay's eviction check,
            # the prompt tokens vLLM read from its prefix cache
            record["evidence"][key] = value
    if request.forecast is not None:
        record["forecast"] = forecast_check.compare(request.forecast, record)
    if segments:
        record["segments"] = [{"stage": stage.partition(".")[0], "substage": stage,
                               "start_s": round((start - request.start_ns) / _NS, 6),
                               "duration_s": round((end - start) / _NS, 6)}
                              for start, end, stage in tiles]
    return record


def summarize(records: list[dict]) -> dict[str, dict]:
    """Per scenario, in replay order then first appearance: n, TTFT p50, stage p50s."""
    order = {name: i for i, name in enumerate(semconv.SCENARIOS)}
    seen: dict[str, int] = {}
    for record in records:
        seen.setdefault(record["scenario"], len(seen))
    names = sorted(seen, key=lambda n: (order.get(n, len(order)), seen[n]))
    out = {}
    for name in names:
        rows = [r for r in records if r["scenario"] == name]
        keys = sorted({k for r in rows for k in r["substages"]})
        out[name] = {
            "n": len(rows),
            "ttft_p50_s": round(verdict.median([r["client_ttft_s"] for r in rows]), 6),
            "stages_p50": {s: round(verdict.median([r["stages"][s] for r in rows]), 6)
                           for s in PIPELINE},
            "substages_p50": {k: round(verdict.median([r["substages"].get(k, 0.0)
                                                       for r in rows]), 6) for k in keys},
        }
    return out
