"""The ranks of an engine's workers: the critical path along the slowest rank (the pure rule,
``diagnosis.ranks``), the live verdict's sentence and attributes, analyze's document and
``check``, the rank part and the span tagging that reads it, the ledger's ranked intervals, and
the rank-skew alert (its thresholds equal to the rule's, its unit test not vacuous)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from otel_ttft import semconv
from otel_ttft.diagnosis import activation as diagnosis
from otel_ttft.diagnosis import ranks, thresholds
from otel_ttft.diagnosis.ranks import RankedInterval as R
from otel_ttft.runtime import ranks as rank_state

S = 1_000_000_000
ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "collector-config" / "rules"


def _tp2(load_1_s: float, *, wait_0: bool = False) -> list[R]:
    """Two ranks: process start, device init, load (reads inside), KV allocation; rank 1's
    load takes ``load_1_s``."""
    out = []
    for rank in (0, 1):
        load = load_1_s if rank == 1 else 1.2
        t = 0
        out.append(R(t, t + 10 * S, semconv.STAGE_WARMUP_PROCESS_START, rank))
        t += 10 * S
        out.append(R(t, t + 2 * S, semconv.STAGE_WARMUP_DEVICE_INIT, rank))
        t += 2 * S
        out.append(R(t, t + int(load * S), semconv.STAGE_LOAD, rank))
        out.append(R(t + S // 10, t + S // 5, semconv.STAGE_LOAD_READ, rank))
        t += int(load * S)
        out.append(R(t, t + S // 2, semconv.STAGE_WARMUP_KV_ALLOC, rank))
    if wait_0:  # rank 0 waited 14 s inside its device init for rank 1, at the collective
        out.append(R(10 * S, 26 * S, semconv.STAGE_WARMUP_DEVICE_INIT, 0))
        out.append(R(11 * S, 25 * S, semconv.STAGE_WARMUP_DEVICE_INIT, 0, wait=True))
    return out


def test_a_rank_behind_in_one_stage_is_the_gate():
    gate = ranks.gate(_tp2(16.3))
    assert gate is not None
    assert (gate["rank"], gate["stage"], gate["fastest_rank"]) == (1, semconv.STAGE_LOAD, 0)
    assert gate["skew_s"] == pytest.approx(15.1, abs=1e-6)
    assert gate["slowest_s"] == pytest.approx(16.2, abs=1e-6)  # load less its 0.1 s of reads
    assert "its storage" in gate["fix"]
    assert ranks.sentence(gate).startswith("rank 1 gated the start: load 16.2 s against 1.1 s "
                                           "on rank 0 (+15.1 s)")


@pytest.mark.parametrize("load_1_s", [1.2, 1.9, 2.0])
def test_ranks_within_the_noise_name_no_rank(load_1_s):
    # 0.7 s apart (under a second), 0.8 s apart (under twice the fastest): no gate
    assert ranks.gate(_tp2(load_1_s)) is None
    assert ranks.skews(_tp2(load_1_s))[semconv.STAGE_LOAD]["skew_s"] == pytest.approx(
        load_1_s - 1.2, abs=1e-6)


def test_one_rank_has_no_skew():
    assert ranks.skews([i for i in _tp2(16.3) if i.rank == 0]) == {}
    assert ranks.gate([]) is None


def test_waiting_for_the_others_is_not_the_waiting_ranks_stage():
    """Rank 0 waited 14 s for rank 1 in its device init (a collective): its own device init is
    what remains, and the gate is rank 1's load, not rank 0's device init."""
    found = ranks.skews(_tp2(16.3, wait_0=True))
    device = found[semconv.STAGE_WARMUP_DEVICE_INIT]
    assert device["slowest_s"] < 3.0  # not 16 s: 14 of them were the wait
    assert ranks.gate(_tp2(16.3, wait_0=True))["stage"] == semconv.STAGE_LOAD


def test_the_verdict_names_the_gate_and_analyze_the_same():
    record = {"id": "a" * 32, "key": "k", "model": "m", "kind": "start", "at": 1.0,
              "duration_s": 40.0, "stages": {"load": 30.0, "warmup": 10.0},
              "evidence": {}, "facts": {},
              "ranks": {"gate": ranks.gate(_tp2(16.3)), "skews": ranks.skews(_tp2(16.3))}}
    result = diagnosis.judge(record, [])
    assert result["rank_gate"]["rank"] == 1
    assert "rank 1 gated the start: load" in result["summary"]
    ordinary = dict(record, ranks={"gate": None, "skews": ranks.skews(_tp2(1.2))})
    assert diagnosis.judge(ordinary, [])["rank_gate"] is None
    assert "gated" not in diagnosis.judge(ordinary, [])["summary"]
    # a hand-edited history file's gate that is not one: ignored, no crash
    broken = dict(record, ranks={"gate": {"rank": "1", "stage": 3}})
    assert diagnosis.judge(broken, [])["rank_gate"] is None

    from otel_ttft.runtime.hooks.activation_verdict import attributes

    attrs = attributes(result)
    assert attrs[semconv.ATTR_VERDICT_RANK] == 1
    assert attrs[semconv.ATTR_VERDICT_RANK_STAGE] == semconv.STAGE_LOAD
    assert attrs[semconv.ATTR_VERDICT_RANK_SKEW_S] == pytest.approx(15.1)


def _span(trace, span_id, parent, name, start, end, **attrs):
    return {"trace_id": trace, "span_id": span_id, "parent_span_id": parent, "name": name,
            "kind": 1, "start_ns": start, "end_ns": end, "attributes": attrs, "resource": {},
            "events": [], "links": [], "status": {}, "scope": {}}


def _trace(trace: str, load_1_s: float) -> list[dict]:
    root = _span(trace, "r" * 16, None, semconv.SPAN_ACTIVATION, 0, 30 * S,
                 **{semconv.ATTR_ACTIVATION_KIND: "start", semconv.GEN_AI_REQUEST_MODEL: "m"})
    out = [root]
    for n, i in enumerate(_tp2(load_1_s)):
        out.append(_span(trace, f"{n:016x}", root["span_id"], "x", i.start_ns, i.end_ns,
                         **{semconv.ATTR_STAGE: i.stage, semconv.ATTR_PARALLEL_RANK: i.rank}))
    return out


def test_analyze_names_the_gated_start_and_stages_sum_to_its_wall_time():
    from otel_ttft.tools.analysis import activations
    from otel_ttft.tools.analysis.breakdown import collect

    collected = collect([_trace("1" * 32, 1.3), _trace("2" * 32, 16.3)])
    gated = activations.gated(collected.activations)
    assert [g["trace_id"] for g in gated] == ["2" * 32]
    assert gated[0]["rank_gate"]["rank"] == 1 and "rank 1 gated" in gated[0]["summary"]
    for summary in collected.activations:  # two ranks side by side: counted once
        record = activations.record(summary, "k")
        assert sum(record["stages"].values()) == pytest.approx(record["duration_s"])


def test_check_names_a_start_a_rank_gated_where_the_baseline_had_none():
    from otel_ttft.tools.analysis.check import rank_gates
    from otel_ttft.tools.analysis.contract import Analysis

    gate = ranks.gate(_tp2(16.3))
    base = {"schema": "otel-ttft/analysis/v1", "run": {"run_id": None}, "requests": [],
            "scenarios": {}}
    current = dict(base, gated_activations=[{"trace_id": "2" * 32, "duration_s": 30.0,
                                             "rank_gate": gate, "summary": ranks.sentence(gate)}])
    lines = rank_gates(Analysis.model_validate(current), Analysis.model_validate(base))
    assert len(lines) == 1 and "rank 1 gated the start: load" in lines[0]
    assert rank_gates(Analysis.model_validate(current), Analysis.model_validate(current)) == []


def test_the_rank_part_tags_spans_and_labels_metrics(exporter):
    from opentelemetry import trace

    from otel_ttft.runtime.state import ProcessIdentity
    from otel_ttft.runtime.telemetry import spans

    tracer = trace.get_tracer("otel_ttft")  # the process-wide provider ``exporter`` reads
    identity = ProcessIdentity()
    part = rank_state.RankState()
    try:
        with spans.stage_span("before", semconv.STAGE_WARMUP, tracer=tracer, identity=identity):
            pass
        part.note(rank=1, world_size=2, tp_size=2, pp_size=1, dp_rank=0, dp_size=1)
        part.note(tp_rank=1, pp_rank=0, rank=None)  # None: what is not known stays as it was
        with spans.stage_span("after", semconv.STAGE_WARMUP, tracer=tracer, identity=identity):
            pass
        assert rank_state.metric_labels() == {
            semconv.ATTR_PARALLEL_RANK: 1, semconv.ATTR_PARALLEL_TP_RANK: 1,
            semconv.ATTR_PARALLEL_PP_RANK: 0, semconv.ATTR_PARALLEL_DP_RANK: 0}
    finally:
        part.close()
    assert rank_state.span_attributes() == {}
    by_name = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
    assert semconv.ATTR_PARALLEL_RANK not in by_name["before"]
    after = by_name["after"]
    assert [after.get(k) for k in semconv.PARALLEL_ATTRIBUTES] == [1, 2, 1, 2, 0, 1, 0, 1]


def test_the_ledger_keeps_each_workers_rank(tmp_path, monkeypatch):
    from otel_ttft.runtime.hooks import activation_ledger as ledger

    entry = ledger._Entry()
    ledger._add(entry, 0, S, semconv.STAGE_LOAD, {semconv.ATTR_PARALLEL_RANK: 1})
    ledger._add(entry, S, 2 * S, semconv.STAGE_LOAD, {semconv.ATTR_PARALLEL_RANK: 0})
    ledger._add(entry, 2 * S, 3 * S, semconv.STAGE_WARMUP, {})
    ledger._add(entry, 3 * S, 4 * S, semconv.STAGE_WARMUP_DEVICE_INIT,
                {semconv.ATTR_PARALLEL_RANK: 0, semconv.ATTR_PARALLEL_WAIT: True})
    assert entry.spans == [[0, S, "load", 1], [S, 2 * S, "load", 0], [2 * S, 3 * S, "warmup"],
                           [3 * S, 4 * S, "warmup.device_init", 0, 1]]
    # what another process wrote, read back: ranks and the wait kept, garbage left out
    monkeypatch.setattr(ledger, "_ledgers", [])
    monkeypatch.setattr(ledger.state_files, "state_dir", lambda: tmp_path)
    data = entry.as_json()
    data["spans"] += [[0, S, "load", "1"], [0, S, "load", True], [0, S, "load", 1, 1, 1]]
    ledger.state_files.write_atomic(ledger._path("a" * 32, 1), data)
    part = ledger.gather("a" * 32)
    assert len(part["intervals"]) == 4
    assert part["ranked"] == [R(0, S, "load", 1), R(S, 2 * S, "load", 0),
                              R(3 * S, 4 * S, "warmup.device_init", 0, wait=True)]


def test_the_alert_thresholds_are_the_rules():
    doc = yaml.safe_load((RULES / "otel-ttft-ranks.yml").read_text())
    records = {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    assert records["otel_ttft:threshold:rank_skew_factor"] == \
        f"vector({thresholds.RANK_SKEW_FACTOR:g})"
    assert records["otel_ttft:threshold:rank_skew_min_seconds"] == \
        f"vector({thresholds.RANK_SKEW_MIN_SECONDS:g})"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_rank_skew_alert_test_fails_when_the_rule_never_fires(tmp_path):
    copy = tmp_path / "rules"
    shutil.copytree(RULES, copy)
    path = copy / "otel-ttft-ranks.yml"
    text = path.read_text()
    path.write_text(text.replace("rank_skew_min_seconds\n        expr: vector(1)",
                                 "rank_skew_min_seconds\n        expr: vector(1000)"))
    assert path.read_text() != text
    ok = subprocess.run(["promtool", "test", "rules",
                         str(RULES / "tests" / "otel-ttft-ranks.test.yml")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = subprocess.run(["promtool", "test", "rules",
                             str(copy / "tests" / "otel-ttft-ranks.test.yml")],
                            capture_output=True, text=True, timeout=120)
    assert broken.returncode != 0 and "OtelTtftRankSkew" in broken.stdout + broken.stderr


def test_replay_serves_several_workers_through_its_templates(receiver, monkeypatch, capsys,
                                                             tiny_model):
    """``replay --tensor-parallel-size 2``: vLLM's own flag on the default serve templates, and so
    in the setup ``verify`` re-runs; a template of the user's own is left as given."""
    from otel_ttft.tools import cli
    from otel_ttft.tools.replay import command

    ran: list[dict] = []
    monkeypatch.setattr(command, "_run", lambda driver, targets, *a, **kw: ran.append(
        {"targets": targets, "setup": kw["setup"]}) or 0)
    own = ("{instrument} {python} -m vllm.entrypoints.openai.api_server --model {model} "
           "--port {port}")
    assert cli.main(["replay", "--otlp-endpoint", receiver.http_endpoint, "--model-a",
                     str(tiny_model), "--model-b", str(tiny_model), "--name-a", "a",
                     "--name-b", "b", "--scenarios", "short-prompt,cold-switch",
                     "--tensor-parallel-size", "2", "--serve-b", own]) == 0
    (run,) = ran
    a, b = run["targets"]
    assert a.template.endswith(" --tensor-parallel-size 2")
    assert b.template == own
    recorded = {t["name"]: t["template"] for t in run["setup"]["targets"]}
    assert recorded["a"].endswith(" --tensor-parallel-size 2")
    assert cli.main(["replay", "--tensor-parallel-size", "0"]) == 2
    assert "--tensor-parallel-size: must be >= 1" in capsys.readouterr().err


@pytest.mark.vllm_import
def test_doctor_says_how_many_workers_the_serve_arguments_start(tiny_model):
    """vLLM's own config for the arguments given: 2 workers at --tensor-parallel-size 2, one
    without; the rank hooks resolve against the installed vLLM."""
    import json
    import os
    import sys

    def doctor(*serve_args):
        proc = subprocess.run([sys.executable, "-m", "otel_ttft.tools.doctor", "--json", "--",
                               "--model", str(tiny_model), *serve_args],
                              capture_output=True, text=True, env=dict(os.environ), timeout=300)
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout
        return json.loads(text[text.index("\n{") + 1 if not text.startswith("{") else 0:])

    report = doctor("--tensor-parallel-size", "2")
    workers = report["model_runner"]["workers"]
    assert (workers["workers"], workers["per_engine"], workers["tensor_parallel_size"]) == \
        (2, 2, 2)
    hooks = {h["name"]: h["resolved"] for h in report["hooks"]}
    assert hooks["ranks.worker"] and hooks["ranks.group"] and hooks["ranks.rendezvous"]
    assert doctor()["model_runner"]["workers"]["workers"] == 1


def test_analyze_leaves_out_ranks_no_worker_has():
    from otel_ttft.tools.analysis.breakdown import collect

    spans = _trace("3" * 32, 16.3)
    for span in spans[1:]:
        if span["attributes"][semconv.ATTR_PARALLEL_RANK] == 1:
            span["attributes"][semconv.ATTR_PARALLEL_RANK] = -1  # or a string, a bool, 2**80
    spans[2]["attributes"][semconv.ATTR_PARALLEL_RANK] = "0"
    spans[3]["attributes"][semconv.ATTR_PARALLEL_RANK] = True
    spans[4]["attributes"][semconv.ATTR_PARALLEL_RANK] = 2 ** 80
    (summary,) = collect([spans]).activations
    assert summary.rank_gate is None and summary.rank_skews == {}  # one valid rank left


def test_analyze_prints_the_gated_start_and_its_document_validates():
    import io
    import json

    from otel_ttft.tools.analysis.analyze import analyze
    from otel_ttft.tools.analysis.breakdown import collect
    from otel_ttft.tools.analysis.contract import parse_analysis
    from otel_ttft.tools.analysis.render import print_analysis

    doc = analyze(collect([_trace("1" * 32, 1.3), _trace("2" * 32, 16.3)]), source="test")
    out = io.StringIO()
    print_analysis(doc, out)
    text = out.getvalue()
    assert "Starts along their slowest worker rank" in text
    assert "start 22222222 of m (30.00 s): rank 1 gated the start: load 16.2 s" in text
    parsed = parse_analysis(json.dumps(doc))
    (gated,) = parsed.gated_activations
    assert (gated.rank_gate.rank, gated.rank_gate.stage) == (1, semconv.STAGE_LOAD)
