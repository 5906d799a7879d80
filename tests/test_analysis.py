"""Trees, coverage and per-stage time on synthetic spans; loading and the `tree` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools import cli
from otel_ttft.tools.analysis.traces import (
    UNATTRIBUTED,
    TraceFileError,
    build_trees,
    coverage,
    find_activation_roots,
    load_spans,
    self_time_by_stage,
)
from otel_ttft.tools.analysis.tree import render_tree
from otel_ttft.tools.sink.store import SpanStore

T0 = 1_700_000_000_000_000_000
TRACE = "ab" * 16
OTHER_TRACE = "cd" * 16


def span(sid: int, name: str, start_s: float, end_s: float, parent: int | None = None,
         stage: str | None = None, trace_id: str = TRACE, **attrs) -> dict:
    attributes = dict(attrs)
    if stage:
        attributes[semconv.ATTR_STAGE] = stage
    return {
        "trace_id": trace_id, "span_id": f"{sid:016x}",
        "parent_span_id": None if parent is None else f"{parent:016x}",
        "name": name, "kind": "INTERNAL",
        "start_ns": T0 + int(start_s * 1e9), "end_ns": T0 + int(end_s * 1e9),
        "attributes": attributes, "resource": {"vllm.process_kind": "worker"},
        "scope": "test", "events": [], "links": [], "status": {"code": "UNSET", "message": ""},
    }


def activation_spans() -> list[dict]:
    """0-10 s activation; children overlap each other and stick out of their parents."""
    return [
        span(1, semconv.SPAN_ACTIVATION, 0, 10, **{semconv.ATTR_PROCESS_KIND: "api_server"}),
        span(2, "Load model", 1, 4, parent=1, stage=semconv.STAGE_LOAD),
        span(3, semconv.SPAN_SHARD_READ, 1.5, 2.5, parent=2, stage=semconv.STAGE_LOAD_READ, **{
            semconv.ATTR_SHARD_PATH: "/models/tiny/model-00001-of-00004.safetensors",
            semconv.ATTR_SHARD_BYTES: 1_900_000, semconv.ATTR_READ_GB_PER_S: 0.0019,
            semconv.ATTR_PAGE_CACHE_RESIDENT: 0.5}),
        span(4, semconv.SPAN_PROCESS_WEIGHTS, 3, 5, parent=2, stage=semconv.STAGE_LOAD_PROCESS),
        span(5, semconv.SPAN_KV_ALLOC, 3.5, 6, parent=1, stage=semconv.STAGE_WARMUP_KV_ALLOC,
             **{semconv.ATTR_KV_BLOCKS: 128, semconv.ATTR_KV_BYTES: 1_073_741_824}),
        span(6, semconv.SPAN_TORCH_COMPILE, 7, 12, parent=1, stage=semconv.STAGE_WARMUP_COMPILE,
             **{semconv.ATTR_COMPILE_CACHE_HIT: False, semconv.ATTR_GRAPH_COUNT: 3}),
        span(7, "stale parent", -1, 0.5, parent=1),
    ]


def test_build_trees_roots_children_and_orphans() -> None:
    spans = activation_spans() + [
        span(20, "orphan", 2, 3, parent=99, trace_id=OTHER_TRACE),
        span(21, "orphan child", 2.1, 2.2, parent=20, trace_id=OTHER_TRACE),
        span(22, "lone", 1, 2, trace_id=OTHER_TRACE),
    ]
    spans.append(dict(spans[1]))  # exported twice: counts once
    trees = build_trees(spans)
    assert set(trees) == {TRACE, OTHER_TRACE}
    (root,) = trees[TRACE]
    assert root.name == semconv.SPAN_ACTIVATION
    assert [c.name for c in root.children] == [
        "stale parent", "Load model", semconv.SPAN_KV_ALLOC, semconv.SPAN_TORCH_COMPILE]
    load = root.children[1]
    assert [c.name for c in load.children] == [semconv.SPAN_SHARD_READ,
                                               semconv.SPAN_PROCESS_WEIGHTS]
    assert load.parent is root and load.stage == semconv.STAGE_LOAD
    assert [r.name for r in trees[OTHER_TRACE]] == ["lone", "orphan"]
    assert [c.name for c in trees[OTHER_TRACE][1].children] == ["orphan child"]
    assert sum(1 for _ in root.walk()) == 7
    (act,) = find_activation_roots(spans)
    assert act.span_id == root.span_id


def test_parent_cycle_does_not_lose_spans() -> None:
    spans = [span(1, "a", 0, 1, parent=2), span(2, "b", 0, 1, parent=1)]
    roots = build_trees(spans)[TRACE]
    assert sum(1 for r in roots for _ in r.walk()) == 2


def test_coverage_overlap_and_outside() -> None:
    (root,) = build_trees(activation_spans())[TRACE]
    # children union clipped to [0, 10]: [0, 0.5] + [1, 6] + [7, 10]
    assert coverage(root) == pytest.approx(0.85)
    load = root.children[1]
    # [1.5, 2.5] + [3, 5] clipped to [3, 4], over 3 s
    assert coverage(load) == pytest.approx(2 / 3)
    leaf = load.children[0]
    assert coverage(leaf) == 0.0


def test_self_time_by_stage() -> None:
    (root,) = build_trees(activation_spans())[TRACE]
    got = self_time_by_stage(root)
    expected = {
        UNATTRIBUTED: 2.0,  # 0-1 (only a stage-less span) and 6-7
        semconv.STAGE_LOAD: 1.0,  # 1-1.5 and 2.5-3
        semconv.STAGE_LOAD_READ: 1.0,
        semconv.STAGE_LOAD_PROCESS: 2.0,  # 3-5: deeper than the KV span it overlaps
        semconv.STAGE_WARMUP_KV_ALLOC: 1.0,  # 5-6
        semconv.STAGE_WARMUP_COMPILE: 3.0,  # 7-10, clipped at the root's end
    }
    assert got.keys() == expected.keys()
    for stage, seconds in expected.items():
        assert got[stage] == pytest.approx(seconds, abs=1e-6), stage
    assert sum(got.values()) == pytest.approx(root.duration_s)


def test_render_tree() -> None:
    (root,) = build_trees(activation_spans())[TRACE]
    text = render_tree(root)
    lines = text.splitlines()
    assert lines[0].startswith(f"{semconv.SPAN_ACTIVATION} 10.00 s @+0.00 ms (api_server)")
    shard = next(line for line in lines if semconv.SPAN_SHARD_READ in line)
    assert "[load.read]" in shard and "1.00 s" in shard and "@+1.50 s" in shard
    assert "model-00001-of-00004.safetensors" in shard and "/models" not in shard
    assert "1.90 MB" in shard and "1.9 MB/s" in shard and "page cache 50%" in shard
    assert "(worker)" in shard
    kv = next(line for line in lines if semconv.SPAN_KV_ALLOC in line)
    assert "kv blocks 128" in kv and "kv 1.07 GB" in kv
    compile_line = next(line for line in lines if semconv.SPAN_TORCH_COMPILE in line)
    assert "compile cache miss" in compile_line and "graphs 3" in compile_line
    assert "@-1.00 s" in text  # the span that started before its parent
    assert "coverage: 85.0%" in text
    footer = lines[lines.index("self time by stage:") + 1:]
    assert footer[0].split()[0] == semconv.STAGE_WARMUP_COMPILE
    assert footer[0].split()[1:3] == ["3.00", "s"]
    assert [f.split()[0] for f in footer[1:3]] == sorted([semconv.STAGE_LOAD_PROCESS,
                                                          UNATTRIBUTED])
    shallow = render_tree(root, max_depth=1)
    assert semconv.SPAN_SHARD_READ not in shallow and "(+2 spans hidden)" in shallow


def _write_lines(path: Path, lines: list[str], newline_at_end: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""))
    return path


def test_load_store_jsonl_and_otlp_json(tmp_path: Path) -> None:
    spans = activation_spans()
    store = SpanStore(tmp_path / "store")
    store.add_spans(spans[:3])
    store.add_spans(spans[3:])
    assert load_spans(tmp_path / "store") == spans
    assert load_spans(store.spans_path) == spans

    otlp = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [{
        "traceId": TRACE, "spanId": "00000000000000aa", "name": "from collector",
        "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**9),
        "attributes": [{"key": "ttft.stage", "value": {"stringValue": "load"}}]}]}]}]}
    metrics_line = {"resourceMetrics": []}
    per_line = _write_lines(tmp_path / "otlp.json",
                            [json.dumps(otlp), json.dumps(metrics_line), json.dumps(otlp)])
    got = load_spans(per_line)
    assert [s["name"] for s in got] == ["from collector"] * 2
    assert got[0]["trace_id"] == TRACE and got[0]["span_id"] == "00000000000000aa"
    assert got[0]["attributes"] == {"ttft.stage": "load"}
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(otlp, indent=2))
    assert [s["name"] for s in load_spans(pretty)] == ["from collector"]

    truncated = _write_lines(tmp_path / "t.jsonl", [json.dumps(s) for s in spans[:2]]
                             + ['{"trace_id": "ab'], newline_at_end=False)
    assert load_spans(truncated) == spans[:2]


@pytest.mark.parametrize("bad_line, reason", [
    ("{oops", "not JSON"),
    ('{"trace_id": "x", "span_id": "y", "name": "n"}', "start_ns"),
    ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "x"}]}]}]}',
     "OTLP/JSON"),
    ('{"something": 1}', "neither a span"),
    ("[1]", "expected a JSON object"),
])
def test_malformed_file_names_line(tmp_path: Path, bad_line: str, reason: str) -> None:
    good = json.dumps(activation_spans()[0])
    path = _write_lines(tmp_path / "spans.jsonl", [good, "", bad_line, good])
    with pytest.raises(TraceFileError) as info:
        load_spans(path)
    assert info.value.lineno == 3
    assert "spans.jsonl:3: " in str(info.value) and reason in str(info.value)


def test_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="no such file"):
        load_spans(tmp_path / "nope.jsonl")
    with pytest.raises(TraceFileError, match="not a store"):
        load_spans(tmp_path)
    with pytest.raises(TraceFileError, match="empty file"):
        load_spans(_write_lines(tmp_path / "empty.jsonl", []))


def test_cli_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = SpanStore(tmp_path / "store")
    store.add_spans(activation_spans() + [span(30, "lone", 0, 1, trace_id=OTHER_TRACE)])
    assert cli.main(["tree", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(semconv.SPAN_ACTIVATION) and "lone" not in out
    assert "self time by stage:" in out

    assert cli.main(["tree", str(store.spans_path), "--trace", OTHER_TRACE]) == 0
    assert capsys.readouterr().out.startswith("lone")


def test_cli_tree_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write_lines(tmp_path / "bad.jsonl", [json.dumps(activation_spans()[0]), "{oops"])
    assert cli.main(["tree", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl:2" in err
    assert cli.main(["tree", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert cli.main(["tree", str(bad.parent)]) == 2  # a directory without spans.jsonl
    assert "not a store" in capsys.readouterr().err
    SpanStore(tmp_path / "store").add_spans(activation_spans())
    assert cli.main(["tree", str(tmp_path / "store"), "--trace", "00" * 16]) == 2
    assert "no spans of trace" in capsys.readouterr().err
