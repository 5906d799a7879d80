"""`otel-ttft check`: thresholds both ways, per-stage overrides, the run-settings guard."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from otel_ttft.tools.analysis.check import (
    ThresholdError,
    Thresholds,
    build_thresholds,
    compare,
    run_check,
)
from otel_ttft.tools.analysis.contract import Analysis
from otel_ttft.tools.cli import main
from tests.analysis_fixture import PROFILES, build_analysis


def doc(**kw) -> Analysis:
    return Analysis.model_validate(build_analysis(**kw))


def check(current: Analysis, baseline: Analysis, thresholds: Thresholds | None = None,
          **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run_check(current, baseline, thresholds or Thresholds(), out=out, err=err, **kw)
    return rc, out.getvalue(), err.getvalue()


def test_identical_runs_pass_with_one_line() -> None:
    rc, out, err = check(doc(), doc())
    assert rc == 0 and err == ""
    assert out.count("\n") == 1 and out.startswith("ok: 6 scenarios")


def test_slower_compile_fails_naming_scenario_stage_and_numbers() -> None:
    # warmup.compile x1.6: cold-switch 1.6 s -> 2.56 s, switch-back 0.3 s -> 0.48 s
    rc, out, _ = check(doc(factor={"warmup.compile": 1.6}), doc())
    assert rc == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("REGRESSION")]
    assert lines == [
        "REGRESSION cold-switch warmup.compile: 1.600s -> 2.560s (+0.960s, +60%; "
        "allowed +0.400s: 25% of before, at least 0.050s)",
        "REGRESSION switch-back warmup.compile: 0.300s -> 0.480s (+0.180s, +60%; "
        "allowed +0.075s: 25% of before, at least 0.050s)",
    ]
    assert out.splitlines()[-1].startswith("FAIL: 2 regression(s)")


def test_growth_within_ratio_passes_and_just_beyond_fails() -> None:
    base = doc()
    assert check(doc(factor={"load.read": 1.2}), base)[0] == 0  # +20% < 25%
    rc, out, _ = check(doc(factor={"load.read": 1.3}), base)  # +30% > 25%
    assert rc == 1 and "cold-switch load.read" in out
    # the whole load stage of cold-switch grew 0.72 s on 2.9 s (24.8 %): within its ratio
    assert "cold-switch load:" not in out


def test_absolute_floor_spares_tiny_stages() -> None:
    # network 2 ms -> 6 ms is +200 % but only 4 ms: under the 50 ms floor
    assert check(doc(factor={"network": 3.0}), doc())[0] == 0
    rc, out, _ = check(doc(factor={"network": 3.0}), doc(), Thresholds(min_delta_s=0.001))
    assert rc == 1 and "network" in out


def test_per_stage_override_and_family_fallback() -> None:
    slower = doc(factor={"warmup.compile": 1.6})
    # a generous ratio for the warmup family covers its substages
    assert check(slower, doc(), build_thresholds(None, None, ["warmup=1.0"]))[0] == 0
    # the substage's own ratio wins over its family's
    rc, out, _ = check(slower, doc(), build_thresholds(None, None,
                                                       ["warmup=1.0", "warmup.compile=0.5"]))
    assert rc == 1 and "warmup.compile" in out and "50% of before" in out
    # a strict default does not touch a stage that has its own ratio
    th = build_thresholds("0.01", "0", ["warmup=1.0"])
    assert th.ratio("warmup.kv_alloc") == 1.0 and th.ratio("load.read") == 0.01


def test_shrinking_never_fails() -> None:
    assert check(doc(factor={"warmup.process_start": 0.2, "load.read": 0.1}), doc())[0] == 0


def test_threshold_file_and_command_line_precedence(tmp_path: Path) -> None:
    f = tmp_path / "ttft-gate.toml"
    f.write_text('max_growth = 0.1\nmin_delta_s = 0.01\n[stages]\n"warmup.compile" = 2.0\n')
    th = build_thresholds(None, None, [], str(f))
    assert (th.max_growth, th.min_delta_s, th.ratio("warmup.compile")) == (0.1, 0.01, 2.0)
    th = build_thresholds("0.3", None, ["warmup.compile=0.7"], str(f))
    assert (th.max_growth, th.ratio("warmup.compile")) == (0.3, 0.7)


@pytest.mark.parametrize("args", [
    ("nan", None, []), ("-1", None, []), (None, "inf", []), ("x", None, []),
    (None, None, ["load"]), (None, None, ["=0.5"]), (None, None, ["bogus=0.5"]),
    (None, None, ["load=lots"]),
])
def test_bad_threshold_values_are_refused(args) -> None:
    with pytest.raises(ThresholdError):
        build_thresholds(*args)


@pytest.mark.parametrize("text", [
    "max_growth = [", 'nonsense = 1', "[stages]\nload = true", 'stages = 3',
    "max_growth = -0.5", "x = " + "[" * 100_000 + "]" * 100_000,
])
def test_bad_threshold_files_are_refused(tmp_path: Path, text: str) -> None:
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(ThresholdError):
        build_thresholds(None, None, [], str(f))


def test_different_client_settings_are_refused_unless_allowed() -> None:
    rc, out, err = check(doc(concurrency=4), doc())
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "concurrency 1 -> 4" in err
    assert "--allow-different-runs" in err
    assert check(doc(concurrency=4), doc(), allow_different_runs=True)[0] == 0


def test_only_shared_scenarios_are_compared_and_missing_ones_noted() -> None:
    data = build_analysis()
    del data["scenarios"]["long-prompt"]
    data["requests"] = [r for r in data["requests"] if r["scenario"] != "long-prompt"]
    rc, out, _ = check(Analysis.model_validate(data), doc())
    assert rc == 0 and "not in the current run: long-prompt" in out
    names = {c.scenario for c in compare(Analysis.model_validate(data), doc(), Thresholds())}
    assert "long-prompt" not in names and len(names) == 5


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, slow = tmp_path / "base.json", tmp_path / "slow.json"
    base.write_text(json.dumps(build_analysis()))
    slow.write_text(json.dumps(build_analysis(factor={"load.read": 2.0})))
    assert main(["check", str(base), str(base)]) == 0
    assert main(["check", str(slow), str(base)]) == 1
    assert "REGRESSION cold-switch load.read" in capsys.readouterr().out
    assert main(["check", str(slow), str(base), "--stage", "load=2"]) == 0
    assert main(["check", str(slow), str(base), "--max-growth", "bad"]) == 2
    assert "--max-growth must be a number" in capsys.readouterr().err


def test_names_from_the_input_cannot_drive_the_terminal() -> None:
    base, cur = build_analysis(), build_analysis(factor={"load.read": 2.0})
    for d in (base, cur):
        d["scenarios"]["\x1b[2J\nevil"] = d["scenarios"].pop("cold-switch")
    rc, out, _ = check(Analysis.model_validate(cur), Analysis.model_validate(base))
    assert rc == 1 and "\x1b" not in out and "?[2J?evil load.read" in out


def test_scenario_ttft_is_gated_too() -> None:
    everything = {sub: 1.2 for prof in PROFILES.values() for sub, _ in prof["steps"]}
    slower = doc(factor=everything)  # every stage +20 %: each within the default 25 %
    assert check(slower, doc())[0] == 0
    rc, out, _ = check(slower, doc(), build_thresholds(None, None, ["ttft=0.1"]))
    regressed = [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("REGRESSION")]
    # the three warm short-prompt scenarios grew ~13 ms: under the 50 ms floor
    assert rc == 1 and regressed == [f"REGRESSION {s} ttft" for s in (
        "cold-switch", "switch-back", "long-prompt", "adapter-switch")]
