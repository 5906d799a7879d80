"""The analysis.json contract (``otel-ttft/analysis/v1``), validated once on the way in.

``report`` and ``check`` read files that may come from anywhere (a CI artifact, a colleague, an
attacker), so every field is typed and bounded here and every failure becomes one line of text
(:class:`AnalysisFileError`); the commands never see half-valid data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from otel_ttft import semconv
from otel_ttft.tools import safe_io

SCHEMA = "otel-ttft/analysis/v1"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a replay of thousands of requests is a few MB

# The article's pipeline order: the verdict walks it, the report stacks it, check compares it.
PIPELINE = semconv.TTFT_PIPELINE

Name = Annotated[str, Field(max_length=4096)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Offset = Annotated[float, Field(allow_inf_nan=False)]  # relative times; may start before 0


class AnalysisFileError(Exception):
    """A file that cannot be used; the message is one line, fit for stderr."""


class _Model(BaseModel):
    # strict: a string where a number belongs is an error, not a guess; unknown keys are ignored
    # so that a later v1 writer may add fields. The attribute docstrings are the field
    # descriptions the docs' schema tables show (otel_ttft/tools/reference.py).
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True,
                              use_attribute_docstrings=True)


class Run(_Model):
    """The replay's client settings; all None when the traces are live traffic, not a replay."""

    client: Name | None = None
    """Client name and version (ttft.replay.client)."""
    sampling: dict[str, Any] | Name | None = None  # an object, or the replay span's JSON text
    """temperature, max_tokens and seed: an object, or the replay span's JSON text."""
    concurrency: int | None = None
    """Requests sent at once per step."""
    prompts: dict[str, Any] | Name | None = None
    """Token count and SHA-256 of each prompt (short, long), never the text."""
    driver: Name | None = None
    """How models were switched: restart, sleep, resident or proxy."""
    models: list[Name] = Field(default_factory=list, max_length=1000)
    """Served model (and adapter) names."""
    repeat: int | None = None
    """Runs of each scenario."""
    repeat_warm: int | None = None
    """Later v1: repeats of the cheap scenarios (--repeat-warm)."""
    cold_requests: int | None = None
    """Later v1: the servers' OTEL_TTFT_COLD_REQUESTS."""
    """Later v1: the servers' OTEL_TTFT_COLD_REQUESTS."""
    run_id: Name | None = None
    """The replay run (ttft.replay.run_id)."""
    setup: dict[str, Any] | None = None
    """How to run the replay again (`verify`)."""


class Evidence(_Model):
    """What the request's activation shows; other keys are allowed."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True,
                              use_attribute_docstrings=True)
    bytes_read: int | None = None
    """Checkpoint bytes read by the activation the request waited on (0: none)."""
    page_cache_resident_ratio: float | None = None
    """Share of those bytes already in page cache before the read."""
    compile_cache_hit: bool | None = None
    """Every torch.compile the request waited for hit the cache."""
    model_was_resident: bool | None = None
    """No activation and no eviction overlapped the request."""


class Segment(_Model):
    """One piece of the request's tiling, in time order (what the report draws)."""

    stage: Name
    """Stage family."""
    substage: Name | None = None
    """Full stage value (warmup.compile)."""
    start_s: Offset
    """From the moment the request was made."""
    duration_s: Seconds

    @property
    def family(self) -> str:
        return semconv.stage_family(self.stage)

    @property
    def label(self) -> str:
        return self.substage or self.stage


class Request(_Model):
    """One timed request and its client TTFT split into stages."""

    trace_id: Name
    """The request's trace (replay.request or llm_request)."""
    scenario: Name
    """Replay scenario, or MODEL:first / MODEL:warm for live traffic."""
    model: Name | None = None
    """Requested model or adapter."""
    prompt: Name | None = None
    """short or long (replay)."""
    repeat_index: int | None = None
    """Which repeat of its scenario."""
    prompt_tokens: int | None = None
    client_ttft_s: Seconds
    """Request made -> first content chunk; the stages sum to it."""
    server_ttft_s: Seconds | None = None
    """The server's own TTFT (ttft.request.time_to_first_token)."""
    stages: dict[Name, Seconds]
    """Seconds per stage of the TTFT pipeline (switch, load, warmup, frontend, queue, prefill,
    network); every one present."""
    substages: dict[Name, Seconds] = Field(default_factory=dict)
    """Seconds per sub-stage that took any (load.read, warmup.compile, ...)."""
    evidence: Evidence = Field(default_factory=Evidence)
    activation_trace_id: Name | None = None
    """The activation trace the request was joined to."""
    segments: list[Segment] = Field(default_factory=list, max_length=100_000)
    """The tiling in time order (written with --json only)."""


class Scenario(_Model):
    """Medians over a scenario's requests."""

    n: int = Field(ge=0)
    """Requests."""
    ttft_p50_s: Seconds
    """Median client TTFT."""
    stages_p50: dict[Name, Seconds]
    """Median of each stage."""
    substages_p50: dict[Name, Seconds] = Field(default_factory=dict)
    """Median of each sub-stage."""


class ChainLink(_Model):
    """One stage that grew by at least 10 % of the scenario's TTFT increase (later v1)."""

    stage: Name
    """The stage that grew."""
    substage: Name | None = None
    """Its sub-stage that grew most."""
    delta_s: Annotated[float, Field(allow_inf_nan=False)]
    """Growth of the stage's median, s."""
    share: Annotated[float, Field(allow_inf_nan=False)]
    """Share of the scenario's TTFT increase."""
    noise_s: Seconds | None = None
    """The stage's noise across the baseline's repeats, s."""
    beyond_noise: bool | None = None
    """Whether the growth is beyond that noise."""
    recommendation: Name | None = None
    """The fix for this stage."""


class Verdict(_Model):
    """The earliest stage that expanded against the baseline, and the fix."""

    scenario: Name
    baseline: Name
    """The scenario compared against."""
    stage: Name
    """Stage named (none when nothing expanded)."""
    substage: Name | None = None
    """Its sub-stage that grew most; picks the fix."""
    delta_s: Annotated[float, Field(allow_inf_nan=False)]
    """Growth of the chosen stage's median (of the TTFT median when the stage is none)."""
    recommendation: Name
    """keep-resident, persist-artifacts, tune-admission, tune-context or none."""
    evidence: dict[Name, Any] = Field(default_factory=dict)
    """Bytes read, residency, compile-cache hit, noise, every stage's delta, notes."""
    summary: Annotated[str, Field(max_length=65536)] | None = None
    """Later v1: the verdict in one paragraph, with the chain and what the fix will not remove."""
    outcome: Name | None = None
    """Later v1: expanded, within-noise or undetermined."""
    chain: list[ChainLink] = Field(default_factory=list, max_length=100)
    """Later v1: every stage that grew by at least 10 % of the increase, in pipeline order."""
    change: dict[Name, Any] | None = None
    """The concrete change (analysis/change.py)."""


class Verification(_Model):
    """One change tried by ``otel-ttft verify``: the scenario re-run with only that change."""

    scenario: Name
    """The scenario re-run."""
    baseline: Name | None = None
    """The baseline it was compared against (the original run's requests)."""
    recommendation: Name
    """The verdict's recommendation the change comes from."""
    candidate: dict[Name, Any] = Field(default_factory=dict)
    """The candidate change tried (its id, flags, env, driver)."""
    change: Annotated[str, Field(max_length=65536)] = ""
    """The change in one line, as a command-line operator would apply it."""
    status: Name
    """Verified | not-verified | failed | not-tried."""
    verified: bool = False
    """TTFT fell beyond the noise and the blamed stage shrank."""
    regressed: bool = False
    """The re-run made TTFT worse beyond the noise and 10 %."""
    reason: Annotated[str, Field(max_length=65536)] | None = None
    """Why it is not verified, failed or not tried."""
    run_id: Name | None = None
    """The re-run's replay run id."""
    ttft_p50_before_s: Seconds | None = None
    """TTFT p50 of the original run, s."""
    ttft_p50_after_s: Seconds | None = None
    """TTFT p50 with the change, s."""
    noise_s: Seconds | None = None
    """The verdict's noise, s."""
    stage: Name | None = None
    """The blamed (sub-)stage."""
    stage_before_s: Seconds | None = None
    """Its p50 before, s."""
    stage_after_s: Seconds | None = None
    """Its p50 after, s."""
    stages_p50_before: dict[Name, Seconds] = Field(default_factory=dict)
    """Every stage's p50 before, s."""
    stages_p50_after: dict[Name, Seconds] = Field(default_factory=dict)
    """Every stage's p50 after, s."""
    new_verdict: dict[Name, Any] | None = None
    """The verdict of the re-run against the same baseline."""
    summary: Annotated[str, Field(max_length=65536)] = ""
    """The verification in one line (the `verified: ...` line)."""


class RankGate(_Model):
    """The worker rank that gated a start: in one stage it took at least twice the fastest
    rank's time and a second more (later v1)."""

    rank: int = Field(ge=0)
    """The slowest rank (vLLM's world rank, ttft.parallel.rank)."""
    stage: Name
    """The stage it fell behind in."""
    skew_s: Seconds
    """Its time in that stage less the fastest rank's, s."""
    slowest_s: Seconds
    """Its time in that stage, s."""
    fastest_s: Seconds
    """The fastest rank's time in that stage, s."""
    fastest_rank: int = Field(ge=0)
    """The fastest rank."""
    fix: Annotated[str, Field(max_length=65536)] = ""
    """What to look at on that rank, in words."""


class GatedActivation(_Model):
    """An activation one worker rank gated (later v1)."""

    trace_id: Name
    model: Name | None = None
    kind: Name = "start"
    duration_s: Seconds
    """Start -> ready, s."""
    rank_gate: RankGate
    summary: Annotated[str, Field(max_length=65536)] = ""
    """The gate in one line."""


class Analysis(_Model):
    """The document `otel-ttft analyze --json` writes."""

    schema_: Name = Field(alias="schema")
    """Always otel-ttft/analysis/v1."""
    source: Name = ""
    """What was analyzed (store, file or Tempo URL)."""
    run: Run
    requests: list[Request] = Field(max_length=1_000_000)
    scenarios: dict[Name, Scenario] = Field(max_length=10_000)
    """Per scenario, in replay order."""
    baseline: Name | None = None
    """The default baseline scenario, when there is one."""
    verdicts: list[Verdict] = Field(default_factory=list, max_length=10_000)
    """One per scenario other than its baseline."""
    verifications: list[Verification] = Field(default_factory=list, max_length=10_000)
    gated_activations: list[GatedActivation] = Field(default_factory=list, max_length=10_000)
    """The activations in the source that one worker rank gated (several workers only)."""

    def scenario_names(self) -> list[str]:
        """Scenarios in file order, then any that only appear on requests."""
        names = list(self.scenarios)
        names += [n for n in dict.fromkeys(r.scenario for r in self.requests) if n not in names]
        return names


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "top level"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"


def parse_analysis(text: str | bytes, name: str = "input") -> Analysis:
    """Validate analysis JSON text; :class:`AnalysisFileError` with one line on any defect."""
    if not text or not text.strip():
        raise AnalysisFileError(f"{name}: empty file, expected {SCHEMA} JSON")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise AnalysisFileError(f"{name}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise AnalysisFileError(f"{name}: not UTF-8 text ({exc.reason})") from None
    except ValueError as exc:  # JSONDecodeError and the NaN/Infinity rejection
        raise AnalysisFileError(f"{name}: not valid JSON: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise AnalysisFileError(f"{name}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        shown = json.dumps(schema)[:80] if schema is not None else "none"
        raise AnalysisFileError(f"{name}: schema is {shown}, expected {SCHEMA!r}")
    try:
        analysis = Analysis.model_validate(data)
    except ValidationError as exc:
        raise AnalysisFileError(f"{name}: {_first_error(exc)}".replace("\n", " ")) from None
    except RecursionError:
        raise AnalysisFileError(f"{name}: JSON nested too deeply") from None
    for i, req in enumerate(analysis.requests):
        missing = [s for s in PIPELINE if s not in req.stages]
        if missing:
            raise AnalysisFileError(
                f"{name}: requests.{i}.stages lacks {', '.join(missing)}")
        if any(not math.isfinite(s.start_s + s.duration_s) for s in req.segments):
            raise AnalysisFileError(f"{name}: requests.{i}.segments: time out of range")
    return analysis


def load_analysis(path: str | Path) -> Analysis:
    """Read and validate an analysis.json; :class:`AnalysisFileError` on any defect (the input
    rule, ``safe_io``: a regular file, opened without blocking, at most MAX_FILE_BYTES)."""
    try:
        if safe_io.input_kind(path) == "dir":
            raise AnalysisFileError(f"{path}: is a directory, expected analysis.json")
        data = safe_io.read_bytes(path, MAX_FILE_BYTES, "an analysis.json")
    except safe_io.InputError as exc:
        raise AnalysisFileError(str(exc)) from None
    return parse_analysis(data, str(path))
