"""``otel-ttft verify`` without a working vLLM server: the outcome rule, hostile inputs (one line,
exit 2), servers that never start (a recorded failed verification, exit 1, nothing hangs), what
cannot be tried here, and the original run's files left as they were."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

import pytest

from otel_ttft.tools import cli
from otel_ttft.tools.analysis import knobs, verification
from otel_ttft.tools.analysis.contract import parse_analysis
from otel_ttft.tools.replay import verify_run
from tests.analysis_fixture import build_analysis


def _rows(scenario: str, ttfts: list[float], stage: str, values: list[float]) -> list[dict]:
    out = []
    for t, s in zip(ttfts, values, strict=True):
        stages = {"switch": 0.0, "load": 0.0, "warmup": 0.0, "frontend": 0.0, "queue": 0.0,
                  "prefill": 0.0, "network": 0.0}
        stages[stage.partition(".")[0]] = s
        out.append({"scenario": scenario, "client_ttft_s": t, "stages": stages,
                    "substages": {stage: s} if "." in stage else {}, "model": "B",
                    "prompt": "short", "prompt_tokens": 10, "waiting_at_arrival": 0,
                    "evidence": {"bytes_read": 0, "model_was_resident": False}})
    return out


BASE = _rows("short-prompt", [0.050, 0.052, 0.049], "prefill", [0.03, 0.031, 0.029])
V = {"scenario": "cold-switch", "baseline": "short-prompt", "stage": "warmup",
     "substage": "warmup.compile", "recommendation": "persist-artifacts"}


def test_verified_needs_the_ttft_and_the_blamed_stage_to_fall():
    before = _rows("cold-switch", [60.0], "warmup.compile", [28.0])
    after = _rows("cold-switch", [33.0], "warmup.compile", [1.0])
    r = verification.compare(V, before, after, BASE)
    assert r["verified"] and r["status"] == "verified" and not r["regressed"]
    assert (r["ttft_p50_before_s"], r["ttft_p50_after_s"]) == (60.0, 33.0)
    assert (r["stage"], r["stage_before_s"], r["stage_after_s"]) == ("warmup.compile", 28, 1)
    assert r["stages_p50_before"]["warmup"] == 28.0 and r["noise_s"] > 0
    assert r["_new"]["stage"] == "warmup"  # still slower than the baseline, by less


def test_ttft_that_fell_for_another_reason_is_not_verified():
    before = _rows("cold-switch", [60.0], "warmup.compile", [28.0])
    after = _rows("cold-switch", [50.0], "warmup.compile", [27.5])  # the machine got quieter
    r = verification.compare(V, before, after, BASE)
    assert not r["verified"] and r["reason"] == "warmup.compile did not shrink"


def test_a_change_that_made_it_worse_is_a_regression():
    before = _rows("cold-switch", [60.0], "warmup.compile", [28.0])
    after = _rows("cold-switch", [75.0], "warmup.compile", [28.0])
    r = verification.compare(V, before, after, BASE)
    assert not r["verified"] and r["regressed"] and "got worse" in r["reason"]


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("content, message", [
    (None, "no such file"), ("not json", "not valid JSON"),
    ('{"schema": "other"}', "schema is"),
])
def test_bad_analysis_files_are_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "a.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-ttft verify: ") and message in err and err.count("\n") == 1


def test_an_analysis_without_a_replay_setup_is_refused(tmp_path, capsys):
    path = _write(tmp_path / "a.json", build_analysis())
    assert cli.main(["verify", str(path)]) == 2
    assert "no replay setup" in capsys.readouterr().err
    assert not (tmp_path / "verify").exists()


def _with_setup(tiny_model: Path, template: str, candidates: list[dict]) -> dict:
    doc = build_analysis()
    doc["run"]["setup"] = {
        "version": 1, "driver": "restart", "scenarios": ["short-prompt", "cold-switch"],
        "repeat": 1, "concurrency": 1, "max_tokens": 4, "seed": 1, "max_model_len": 512,
        "tokenizer": str(tiny_model), "start_timeout_s": 60, "request_timeout_s": 30,
        "proxy_url": None, "adapters": {},
        "targets": [{"name": "tiny-llama", "model": str(tiny_model), "template": template,
                     "url": None},
                    {"name": "tiny-qwen2", "model": str(tiny_model), "template": template,
                     "url": None}]}
    for v in doc["verdicts"]:
        v["change"] = {"summary": "", "candidates": candidates if v["scenario"] == "cold-switch"
                       else []}
    return doc


def _candidate(cid: str, **kw) -> dict:
    base = {"id": cid, "recommendation": "keep-resident", "side": "server",
            "models": ["tiny-qwen2"], "args": [], "env": {}, "durable": [], "driver": None,
            "sleep_level": None, "prepare": None, "gpu_only": False, "missing": [],
            "replaces": {}, "reason": "test"}
    return {**base, **kw}


@pytest.mark.parametrize("argv, message", [
    (["--json", "{analysis}"], "is the input"),
    (["--max-tries", "x"], "--max-tries must be an integer"),
    (["--max-tries", "0"], "--max-tries must be 1..10"),
    (["--start-timeout", "-1"], "--start-timeout must be > 0"),
    (["--scenario", "nope"], "no verdict for scenario 'nope'"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, tiny_model, argv, message):
    path = _write(tmp_path / "a.json", _with_setup(tiny_model, "x {port}", [_candidate("r")]))
    argv = [a.replace("{analysis}", str(path)) for a in argv]
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_servers_that_never_start_are_recorded_failures_and_the_input_is_untouched(
        tmp_path, capsys, tiny_model):
    dead = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)' --port {{port}}"
    candidates = [
        _candidate("compile-cache", recommendation="persist-artifacts",
                   env={"VLLM_CACHE_ROOT": "/x"}, durable=["VLLM_CACHE_ROOT"],
                   prepare="fill-cache"),
        _candidate("sleep", side="driver", driver="sleep", args=["--enable-sleep-mode"],
                   gpu_only=True, models=["tiny-llama", "tiny-qwen2"]),
        _candidate("shorter-context", side="client", models=[]),
        _candidate("resident", side="driver", driver="resident",
                   models=["tiny-llama", "tiny-qwen2"]),
        _candidate("lacking", args=["--no-such-flag"], missing=["--no-such-flag"]),
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = _write(run_dir / "analysis.json", _with_setup(tiny_model, dead, candidates))
    before = _digest(run_dir)
    out = tmp_path / "v"
    rc = cli.main(["verify", str(path), "--out", str(out), "--max-tries", "3"])
    text = capsys.readouterr().out
    assert rc == 1
    assert _digest(run_dir) == before  # the original run's files: read, never written
    doc = json.loads((out / "analysis.json").read_text())
    parse_analysis(json.dumps(doc))  # the contract holds for what verify writes
    records = {r["candidate"]["id"]: r for r in doc["verifications"]}
    assert set(records) == {c["id"] for c in candidates}
    for cid in ("compile-cache", "resident"):
        r = records[cid]
        assert r["status"] == "failed" and not r["verified"], r
        assert "exited with code 3" in r["reason"] and "\n" not in r["reason"]
    gpu = records["sleep"]
    if not verify_run.here_has_gpu():
        assert gpu["status"] == "not-tried" and "needs a GPU" in gpu["reason"]
    assert records["shorter-context"]["status"] == "not-tried"
    assert "lacks --no-such-flag" in records["lacking"]["reason"]
    assert "failed: cold-switch" in text and "not tried here: cold-switch" in text
    # The durable cache is one of verify's own directories, never the proposed one.
    cache = records["compile-cache"]["candidate"]["env"]
    assert cache == {"VLLM_CACHE_ROOT": "/x"}
    assert str(out) in records["compile-cache"]["change"]


def test_a_missing_vllm_vocabulary_is_reported_not_guessed(tmp_path, tiny_model, monkeypatch):
    dead = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)' --port {{port}}"
    candidates = [_candidate("one", args=["--max-num-seqs", "8"])]
    path = _write(tmp_path / "a.json", _with_setup(tiny_model, dead, candidates))
    monkeypatch.setattr(knobs, "try_vocabulary", lambda: (None, "vLLM is not installed"))
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v")]) == 0
    doc = json.loads((tmp_path / "v" / "analysis.json").read_text())
    assert [r["reason"] for r in doc["verifications"]] == [
        "the server command cannot be edited: vLLM is not installed"]


def test_tries_stop_at_the_limit(tmp_path, tiny_model):
    dead = f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)' --port {{port}}"
    candidates = [_candidate(cid, side="driver", driver="resident",
                             models=["tiny-llama", "tiny-qwen2"]) for cid in ("r1", "r2")]
    path = _write(tmp_path / "a.json", _with_setup(tiny_model, dead, candidates))
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v"), "--max-tries", "1"]) == 1
    doc = json.loads((tmp_path / "v" / "analysis.json").read_text())
    first, second = doc["verifications"]
    assert first["status"] == "failed"
    assert second["status"] == "not-tried" and "limit of 1 tries" in second["reason"]


def _verified_doc(status: str = "verified", *, regressed: bool = False, cid: str = "compile-cache"
                  ) -> dict:
    doc = build_analysis()
    before = doc["scenarios"]["cold-switch"]
    after_stages = {**before["stages_p50"], "warmup": 0.5}
    doc["verifications"] = [{
        "scenario": "cold-switch", "baseline": "short-prompt", "recommendation":
        "persist-artifacts", "candidate": {"id": cid}, "change": "VLLM_CACHE_ROOT=/d",
        "status": status, "verified": status == "verified", "regressed": regressed,
        "reason": None if status == "verified" else "warmup.compile did not shrink",
        "run_id": "r2", "ttft_p50_before_s": before["ttft_p50_s"],
        "ttft_p50_after_s": before["ttft_p50_s"] * (1.5 if regressed else 0.5),
        "noise_s": 0.004, "stage": "warmup.compile", "stage_before_s": 1.6,
        "stage_after_s": 0.1, "stages_p50_before": before["stages_p50"],
        "stages_p50_after": after_stages, "new_verdict": None,
        "summary": f"{status}: cold-switch <b>x</b>"}]
    return doc


def test_report_draws_before_and_after_per_verification():
    from otel_ttft.tools.analysis.report import render_report

    html = render_report(parse_analysis(json.dumps(_verified_doc())))
    assert 'class="card verification verified"' in html
    assert html.count('data-when="before"') == 1 and 'data-when="with the change"' in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html  # escaped, like the rest


def test_check_fails_a_pipeline_on_a_regressed_or_lost_verification(capsys):
    from otel_ttft.tools.analysis.check import Thresholds, run_check

    base = parse_analysis(json.dumps(build_analysis()))
    ok = parse_analysis(json.dumps(_verified_doc()))
    assert run_check(ok, base, Thresholds()) == 0
    worse = parse_analysis(json.dumps(_verified_doc("not-verified", regressed=True)))
    assert run_check(worse, base, Thresholds()) == 1
    assert "made it worse" in capsys.readouterr().out
    lost = parse_analysis(json.dumps(_verified_doc("not-verified")))
    assert run_check(lost, ok, Thresholds()) == 1
    assert "verified in the baseline, not-verified now" in capsys.readouterr().out


def test_gpu_check_requires_the_gpu_only_changes_to_be_tried():
    from scripts.gpu_check_verify import check_verifications

    doc = {"verifications": [{"scenario": "switch-back", "candidate": {"id": "sleep"},
                              "status": "not-tried", "reason": "needs a GPU"}]}
    assert check_verifications(doc) == ["verify: switch-back sleep not tried on a GPU: needs a "
                                        "GPU"]
    doc["verifications"][0].update(status="verified", ttft_p50_after_s=0.05)
    assert check_verifications(doc) == []


def test_candidate_filter_picks_kinds_per_scenario():
    opts = verify_run.Options(Path("a"), Path("o"), Path("j"), (), 1, None, False,
                          ("cold-switch=compile-cache", "kv-budget"))
    v = {"scenario": "cold-switch", "change": {"candidates": [
        {"id": "resident"}, {"id": "compile-cache"}, {"id": "kv-budget"}]}}
    assert [c["id"] for c in verify_run.wanted(v, opts)] == ["compile-cache", "kv-budget"]
    assert [c["id"] for c in verify_run.wanted({**v, "scenario": "switch-back"}, opts)] == [
        "kv-budget"]


def test_finish_writes_the_outcome_line_and_the_new_verdict():
    before = _rows("cold-switch", [60.0], "warmup.compile", [28.0])
    after = _rows("cold-switch", [31.2], "warmup.compile", [0.9])
    record = {"change": "VLLM_CACHE_ROOT=/d", "summary": ""}
    r = verification.finish(V, record, before, after, BASE)
    assert r["summary"] == ("verified: cold-switch 60.00 s -> 31.20 s (warmup.compile 28.00 s "
                            "-> 900.0 ms) with VLLM_CACHE_ROOT=/d")
    assert set(r["new_verdict"]) == {"stage", "substage", "recommendation", "summary"}
    assert "_new" not in r
    json.dumps(r)  # what verify writes


@pytest.mark.parametrize("bad, message", [
    ({"args": "--max-num-seqs 8"}, ".args: expected a list of strings"),
    ({"env": {"BAD NAME": "x"}}, ".env: expected NAME: string pairs"),
    ({"env": {"X": 1}}, ".env: expected NAME: string pairs"),
    ({"driver": "rm -rf"}, ".driver: 'rm -rf' is not a driver"),
])
def test_malformed_candidates_are_refused_before_anything_runs(tmp_path, capsys, tiny_model,
                                                               bad, message):
    path = _write(tmp_path / "a.json", _with_setup(tiny_model, "x {port}",
                                                   [{**_candidate("c"), **bad}]))
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "v").exists()


def test_a_change_is_judged_by_the_stage_it_is_meant_to_shrink():
    """A compile cache offered after a restart's keep-resident verdict (process start): the
    restart stays, so the process start cannot shrink; the compile must."""
    v = {**V, "substage": "warmup.process_start", "recommendation": "keep-resident"}
    before = _rows("cold-switch", [178.0], "warmup.compile", [56.0])
    after = _rows("cold-switch", [108.0], "warmup.compile", [12.0])
    assert not verification.compare(v, before, after, BASE)["verified"]  # by process start
    r = verification.compare(v, before, after, BASE, "warmup.compile")
    assert r["verified"] and r["stage"] == "warmup.compile"



def test_the_prefix_warm_up_is_tried_through_the_replay_with_warm_prefix(tmp_path, tiny_model,
                                                                       monkeypatch):
    """No flag, no environment: the change is a request the replay sends after each activation
    (``replay --warm-prefix``), with the run's own ``--switch-ahead`` kept."""
    from otel_ttft.tools.replay import command

    seen: list[list[str]] = []
    monkeypatch.setattr(command, "run_argv", lambda argv: seen.append(list(argv)) or 3)
    warm = _candidate("prefix-warm-up", recommendation="warm-up", side="driver", models=[],
                      prepare="warm-prefix", stage="prefill.uncached_prefix")
    doc = _with_setup(tiny_model, "vllm {port}", [warm])
    doc["run"]["setup"]["switch_ahead"] = True
    path = _write(tmp_path / "a.json", doc)
    assert cli.main(["verify", str(path), "--out", str(tmp_path / "v")]) == 1
    (argv,) = seen
    assert "--warm-prefix" in argv and "--switch-ahead" in argv
    assert argv[argv.index("--scenarios") + 1] == "cold-switch"
    (r,) = json.loads((tmp_path / "v" / "analysis.json").read_text())["verifications"]
    assert r["status"] == "failed" and r["stage"] == "prefill.uncached_prefix", r
    assert "one request as users send it (shared prefix, their options) after activation" \
        in r["change"]
