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
    # so that a later v1 writer may add fields.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Run(_Model):
    """The replay's client settings; all None when the traces are live traffic, not a replay."""

    client: Name | None = None
    sampling: dict[str, Any] | Name | None = None  # an object, or the replay span's JSON text
    concurrency: int | None = None
    prompts: dict[str, Any] | Name | None = None
    driver: Name | None = None
    models: list[Name] = Field(default_factory=list, max_length=1000)
    repeat: int | None = None
    run_id: Name | None = None


class Evidence(_Model):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    bytes_read: int | None = None
    page_cache_resident_ratio: float | None = None
    compile_cache_hit: bool | None = None
    model_was_resident: bool | None = None


class Segment(_Model):
    stage: Name
    substage: Name | None = None
    start_s: Offset
    duration_s: Seconds

    @property
    def family(self) -> str:
        return semconv.stage_family(self.stage)

    @property
    def label(self) -> str:
        return self.substage or self.stage


class Request(_Model):
    trace_id: Name
    scenario: Name
    model: Name | None = None
    prompt: Name | None = None
    repeat_index: int | None = None
    prompt_tokens: int | None = None
    client_ttft_s: Seconds
    server_ttft_s: Seconds | None = None
    stages: dict[Name, Seconds]
    substages: dict[Name, Seconds] = Field(default_factory=dict)
    evidence: Evidence = Field(default_factory=Evidence)
    activation_trace_id: Name | None = None
    segments: list[Segment] = Field(default_factory=list, max_length=100_000)


class Scenario(_Model):
    n: int = Field(ge=0)
    ttft_p50_s: Seconds
    stages_p50: dict[Name, Seconds]
    substages_p50: dict[Name, Seconds] = Field(default_factory=dict)


class Verdict(_Model):
    scenario: Name
    baseline: Name
    stage: Name
    substage: Name | None = None
    delta_s: Annotated[float, Field(allow_inf_nan=False)]
    recommendation: Name
    evidence: dict[Name, Any] = Field(default_factory=dict)


class Analysis(_Model):
    schema_: Name = Field(alias="schema")
    source: Name = ""
    run: Run
    requests: list[Request] = Field(max_length=1_000_000)
    scenarios: dict[Name, Scenario] = Field(max_length=10_000)
    baseline: Name | None = None
    verdicts: list[Verdict] = Field(default_factory=list, max_length=10_000)

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
    """Read and validate an analysis.json; :class:`AnalysisFileError` on any defect."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            # a FIFO or device would block or never end: refuse rather than hang
            raise AnalysisFileError(f"{path}: not a regular file")
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise AnalysisFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AnalysisFileError(f"{path}: is a directory, expected analysis.json") from None
    except OSError as exc:
        raise AnalysisFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise AnalysisFileError(
            f"{path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; not an analysis.json")
    return parse_analysis(data, str(path))
