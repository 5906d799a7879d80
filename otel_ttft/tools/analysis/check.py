"""``otel-ttft check CURRENT BASELINE``: a deployment gate on per-scenario stage medians.

A stage (or substage) regresses when its p50 grew by more than ``max(min_delta_s,
ratio * baseline_p50)``: the ratio catches real growth, the absolute floor keeps a 2 ms stage
that became 4 ms from failing a pipeline. Ratios are per stage; a substage without its own ratio
uses its family's (``warmup.compile`` falls back to ``warmup``), then the default. The scenario's
TTFT p50 itself is compared too, as ``ttft``, so many small growths cannot add up unseen.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ttft.semconv import stage_family
from otel_ttft.tools import safe_io
from otel_ttft.tools.analysis.contract import PIPELINE, Analysis

RUN_KEYS = ("client", "sampling", "concurrency", "prompts")
TOTAL = "ttft"  # the scenario's client TTFT p50, compared like a stage


def printable(text: object, limit: int = 80) -> str:
    """Names come from the input: no terminal control sequences, no line breaks, bounded."""
    text = "".join(c if c.isprintable() else "?" for c in str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ThresholdError(ValueError):
    """A threshold setting that cannot be used; one line."""


@dataclass(frozen=True)
class Thresholds:
    max_growth: float = 0.25
    min_delta_s: float = 0.05
    per_stage: dict[str, float] = field(default_factory=dict)

    def ratio(self, stage: str) -> float:
        if stage in self.per_stage:
            return self.per_stage[stage]
        return self.per_stage.get(stage_family(stage), self.max_growth)

    def limit_s(self, stage: str, before_s: float) -> float:
        return max(self.min_delta_s, self.ratio(stage) * before_s)


@dataclass(frozen=True)
class Change:
    scenario: str
    stage: str
    before_s: float
    after_s: float
    limit_s: float
    ratio: float
    floor_s: float

    @property
    def delta_s(self) -> float:
        return self.after_s - self.before_s

    @property
    def regressed(self) -> bool:
        return self.delta_s > self.limit_s

    def describe(self) -> str:
        growth = f", {self.delta_s / self.before_s:+.0%}" if self.before_s > 0 else ""
        return (f"{printable(self.scenario)} {printable(self.stage)}: "
                f"{self.before_s:.3f}s -> {self.after_s:.3f}s "
                f"({self.delta_s:+.3f}s{growth}; allowed +{self.limit_s:.3f}s: "
                f"{self.ratio:.0%} of before, at least {self.floor_s:.3f}s)")


def _number(raw: object, what: str) -> float:
    try:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise ValueError
        value = float(raw)
    except (ValueError, OverflowError):
        raise ThresholdError(f"{what} must be a number, got {str(raw)[:40]!r}") from None
    if not 0 <= value < float("inf"):
        raise ThresholdError(f"{what} must be a finite number >= 0, got {str(raw)[:40]!r}")
    return value


def _stage_ratio(name: str, raw: object, what: str) -> tuple[str, float]:
    name = name.strip()
    if name != TOTAL and stage_family(name) not in PIPELINE:
        raise ThresholdError(
            f"{what} {name[:60]!r}: unknown stage; stages are {', '.join(PIPELINE)} and {TOTAL}")
    return name, _number(raw, f"{what} {name}")


def parse_stage_overrides(items: list[str]) -> dict[str, float]:
    """``["load=0.5", "warmup.compile=1"]`` -> ``{"load": 0.5, "warmup.compile": 1.0}``."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ThresholdError(f"--stage expects STAGE=RATIO (e.g. load=0.5), got {item[:60]!r}")
        key, ratio = _stage_ratio(name, value, "--stage")
        out[key] = ratio
    return out


def load_threshold_file(path: str | Path) -> dict[str, Any]:
    """A TOML file: ``max_growth``, ``min_delta_s`` and a ``[stages]`` table of ratios."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    path = Path(path)
    try:
        data = tomllib.loads(safe_io.read_bytes(path, 1 << 20, "a thresholds file")
                             .decode("utf-8"))
    except safe_io.InputError as exc:
        raise ThresholdError(str(exc)) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ThresholdError(f"{path}: not valid TOML: {exc}".splitlines()[0]) from None
    except RecursionError:
        raise ThresholdError(f"{path}: TOML nested too deeply") from None
    unknown = set(data) - {"max_growth", "min_delta_s", "stages"}
    if unknown:
        raise ThresholdError(f"{path}: unknown keys {', '.join(sorted(unknown))[:100]}")
    stages = data.get("stages", {})
    if not isinstance(stages, dict):
        raise ThresholdError(f"{path}: [stages] must be a table of STAGE = RATIO")
    out: dict[str, Any] = {k: _number(data[k], f"{path}: {k}")
                           for k in ("max_growth", "min_delta_s") if k in data}
    out["stages"] = dict(_stage_ratio(k, v, f"{path}: [stages]") for k, v in stages.items())
    return out


def build_thresholds(max_growth: str | None, min_delta_s: str | None, stages: list[str],
                     path: str | None = None) -> Thresholds:
    """Command-line values win over the file's, the file's over the defaults."""
    conf = load_threshold_file(path) if path else {"stages": {}}
    if max_growth is not None:
        conf["max_growth"] = _number(max_growth, "--max-growth")
    if min_delta_s is not None:
        conf["min_delta_s"] = _number(min_delta_s, "--min-delta-s")
    return Thresholds(max_growth=conf.get("max_growth", Thresholds.max_growth),
                      min_delta_s=conf.get("min_delta_s", Thresholds.min_delta_s),
                      per_stage={**conf["stages"], **parse_stage_overrides(stages)})


def run_differences(current: Analysis, baseline: Analysis) -> list[str]:
    """The client settings that differ; a comparison across them measures the client, not vLLM."""
    diffs = []
    for key in RUN_KEYS:
        a, b = getattr(current.run, key), getattr(baseline.run, key)
        if a != b:
            diffs.append(f"{key} {printable(b, 60)} -> {printable(a, 60)}")
    return diffs


def compare(current: Analysis, baseline: Analysis, thresholds: Thresholds) -> list[Change]:
    """TTFT, every stage and every substage p50 of each scenario present in both runs."""
    changes = []
    for name, before in baseline.scenarios.items():
        after = current.scenarios.get(name)
        if after is None:
            continue
        b, a = before.ttft_p50_s, after.ttft_p50_s
        changes.append(Change(name, TOTAL, b, a, thresholds.limit_s(TOTAL, b),
                              thresholds.ratio(TOTAL), thresholds.min_delta_s))
        for stage in PIPELINE:
            b, a = before.stages_p50.get(stage, 0.0), after.stages_p50.get(stage, 0.0)
            changes.append(Change(name, stage, b, a, thresholds.limit_s(stage, b),
                                  thresholds.ratio(stage), thresholds.min_delta_s))
        for sub in sorted(set(before.substages_p50) | set(after.substages_p50)):
            b, a = before.substages_p50.get(sub, 0.0), after.substages_p50.get(sub, 0.0)
            changes.append(Change(name, sub, b, a, thresholds.limit_s(sub, b),
                                  thresholds.ratio(sub), thresholds.min_delta_s))
    return changes


def verification_regressions(current: Analysis, baseline: Analysis) -> list[str]:
    """``otel-ttft verify`` results that fail a pipeline: a change whose re-run made the TTFT
    worse (beyond the noise and 10 %), and a change verified in the baseline that is no longer
    verified now (same scenario, same kind of change)."""
    out = []
    for v in current.verifications:
        if v.regressed:
            out.append(f"verification {printable(v.scenario)} with {printable(v.change, 120)}: "
                       f"TTFT {v.ttft_p50_before_s or 0:.3f}s -> {v.ttft_p50_after_s or 0:.3f}s "
                       f"(the change made it worse)")
    was = {(v.scenario, v.candidate.get("id")) for v in baseline.verifications if v.verified}
    now = {(v.scenario, v.candidate.get("id")): v for v in current.verifications
           if v.status in ("verified", "not-verified", "failed")}
    for key in sorted(was & now.keys(), key=str):
        v = now[key]
        if not v.verified:
            out.append(f"verification {printable(v.scenario)} with {printable(v.change, 120)}: "
                       f"verified in the baseline, {v.status} now"
                       + (f" ({printable(v.reason, 160)})" if v.reason else ""))
    return out


def rank_gates(current: Analysis, baseline: Analysis) -> list[str]:
    """Starts of the current run that one worker rank gated, in a stage where no rank gated
    the baseline's: the rank, the stage and the skew."""
    before = {g.rank_gate.stage for g in baseline.gated_activations}
    return [f"{printable(g.kind)} {printable(g.trace_id[:8])}: "
            f"{printable(g.summary or g.rank_gate.stage, 300)}"
            for g in current.gated_activations if g.rank_gate.stage not in before]


def run_check(current: Analysis, baseline: Analysis, thresholds: Thresholds, *,
              allow_different_runs: bool = False, out=None, err=None) -> int:
    """Print regressions (exit 1) or a one-line all-clear (exit 0); 2 when runs differ."""
    out, err = out or sys.stdout, err or sys.stderr
    diffs = run_differences(current, baseline)
    if diffs and not allow_different_runs:
        print(f"otel-ttft check: refusing to compare runs with different client settings "
              f"({'; '.join(diffs)}); pass --allow-different-runs to compare anyway", file=err)
        return 2
    shared = [n for n in baseline.scenarios if n in current.scenarios]
    if not shared:
        print("otel-ttft check: no scenario in common between the two runs; nothing to compare",
              file=err)
        return 2
    missing = [n for n in baseline.scenarios if n not in current.scenarios]
    if missing:
        print(f"note: not in the current run: {printable(', '.join(missing), 300)}", file=out)
    changes = compare(current, baseline, thresholds)
    regressions = [c.describe() for c in changes if c.regressed]
    regressions += verification_regressions(current, baseline)
    regressions += rank_gates(current, baseline)
    for line in regressions:
        print(f"REGRESSION {line}", file=out)
    worst = max(changes, key=lambda c: c.delta_s)
    scope = f"{len(shared)} scenarios, {len(changes)} medians (TTFT, stages, substages)"
    if current.verifications:
        scope += f", {len(current.verifications)} verifications"
    if regressions:
        print(f"FAIL: {len(regressions)} regression(s) across {scope}", file=out)
        return 1
    largest = (f"largest growth {printable(worst.scenario)} {printable(worst.stage)} "
               f"{worst.delta_s:+.3f}s"
               if worst.delta_s > 0 else "nothing grew")
    print(f"ok: {scope} within thresholds; {largest}", file=out)
    return 0
