"""`tree`, `export` and `sink` arguments on malformed-but-parseable input, deep and wide trees:
a one-line error and exit 2, or a rendered tree; never a traceback, never quadratic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools import cli
from otel_ttft.tools.analysis.traces import build_trees, iter_traces, load_spans, self_time_by_stage
from otel_ttft.tools.analysis.tree import render_tree
from otel_ttft.tools.sink.otlp_encode import export_json
from otel_ttft.tools.sink.store import SpanStore

TRACE = "ab" * 16


def span(sid: int, parent: int | None = None, name: str = "s", start: int = 0, end: int = 10,
         **over: object) -> dict:
    out = {"trace_id": TRACE, "span_id": f"{sid:016x}",
           "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
           "start_ns": start, "end_ns": end, "attributes": {}, "resource": {}}
    out.update(over)
    return out


def write(path: Path, spans: list[dict]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))
    return path


@pytest.mark.parametrize("bad, reason", [
    (span(1, attributes=["ttft.stage", "load"]), "'attributes' is not a JSON object"),
    (span(1, resource="service"), "'resource' is not a JSON object"),
    (span(1, parent_span_id=7), "'parent_span_id' is not a JSON string"),
    (span(1, start_ns=float("nan")), "start_ns"),
    (span(1, end_ns="10"), "end_ns"),
    (span(1, trace_id=None), "trace_id"),
])
def test_malformed_span_exit_2_one_line(tmp_path: Path, capsys, bad: dict, reason: str) -> None:
    path = write(tmp_path / "spans.jsonl", [span(2), bad])
    assert cli.main(["tree", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "spans.jsonl:2" in err and reason in err, err


def test_odd_values_still_render(tmp_path: Path, capsys) -> None:
    request = span(1, name=semconv.SPAN_REQUEST, start=0, end=100, attributes={
        semconv.ATTR_REQUEST_TTFT: "fast", semconv.ATTR_SHARD_BYTES: "NaN",
        semconv.ATTR_READ_GB_PER_S: float("inf")})
    child = span(2, parent=1, start=50, end=40, attributes={semconv.ATTR_STAGE: 5})
    assert cli.main(["tree", str(write(tmp_path / "s.jsonl", [request, child]))]) == 0
    out = capsys.readouterr().out
    assert "server TTFT ?" in out and "nan" not in out.lower() and "inf" not in out.lower()


def test_parent_cycles_and_self_parent(tmp_path: Path, capsys) -> None:
    spans = [span(1, parent=3), span(2, parent=1), span(3, parent=2),  # a 3-cycle
             span(4, parent=4),  # its own parent
             span(5, parent=2)]  # hangs off the cycle
    trees = build_trees(spans)[TRACE]
    assert sorted(n.span_id for r in trees for n in r.walk()) == [f"{i:016x}" for i in range(1, 6)]
    roots = {r.span_id: sorted(c.span_id for c in r.children) for r in trees}
    # every span on a cycle is a root (keeping its children off the cycle), and so is a span
    # that is its own parent; a well-formed trace in the same input is unaffected
    assert roots == {f"{1:016x}": [], f"{2:016x}": [f"{5:016x}"], f"{3:016x}": [],
                     f"{4:016x}": []}
    well_formed = [span(1), span(2, parent=1), span(3, parent=2)]
    chain = build_trees(well_formed)[TRACE]
    assert len(chain) == 1 and [n.span_id for n in chain[0].walk()] == [
        f"{i:016x}" for i in (1, 2, 3)]
    assert cli.main(["tree", str(write(tmp_path / "c.jsonl", spans))]) == 0


def test_100k_chain_and_100k_staged_children_are_linear() -> None:
    """Both used to be quadratic (or hit the recursion limit at 2,000 deep); the pytest
    timeout is the guard against a regression, not an assertion on speed."""
    n = 100_000
    chain = [span(1, start=0, end=2 * n)] + [
        span(i, parent=i - 1, start=i, end=2 * n - i, attributes={semconv.ATTR_STAGE: "load"})
        for i in range(2, n)]
    (root,) = build_trees(chain)[TRACE]
    text = render_tree(root)
    assert text.count("\n") > n - 2
    assert self_time_by_stage(root)["load"] == pytest.approx((2 * n - 4) / 1e9)
    wide = [span(1, start=0, end=10 * n)] + [
        span(i, parent=1, start=10 * i, end=10 * i + 15,
             attributes={semconv.ATTR_STAGE: f"s{i % 7}"}) for i in range(2, n)]
    (root,) = build_trees(wide)[TRACE]
    stages = self_time_by_stage(root)
    assert sum(stages.values()) == pytest.approx(10 * n / 1e9)
    assert stages["unattributed"] == pytest.approx(20 / 1e9)


def test_iter_traces_same_for_every_source(tmp_path: Path) -> None:
    spans = [span(i, trace_id=f"{i % 3 + 1:032x}", start=i, end=i + 1) for i in range(1, 10)]
    store = SpanStore(tmp_path / "store")
    store.add_spans(spans)
    store.close()
    jsonl = write(tmp_path / "spans.jsonl", spans)
    otlp = tmp_path / "otlp.json"
    assert export_json(iter_traces(tmp_path / "store"), otlp) == 9

    def shape(path: Path) -> list[list[tuple[str, str]]]:
        return [[(s["trace_id"], s["span_id"]) for s in t] for t in iter_traces(path)]

    expected = shape(jsonl)
    assert [t[0][0] for t in expected] == [f"{i:032x}" for i in range(1, 4)]
    assert shape(tmp_path / "store") == shape(store.db_path) == shape(otlp) == expected
    assert [list(t) for t in iter_traces(otlp, trace_id=f"{1:032x}")] == [
        [s for s in load_spans(otlp) if s["trace_id"] == f"{1:032x}"]]


def test_export_round_trip(tmp_path: Path) -> None:
    spans = [span(1, name="a", kind="SERVER", attributes={
        "i": 3, "f": 1.5, "b": True, "s": "x", "l": [1, 2], "d": {"k": "v"}, "n": None},
        resource={"service.name": "svc"}, scope="otel_ttft", events=[
            {"name": "e", "time_ns": 5, "attributes": {"x": 1}}],
        links=[{"trace_id": "cd" * 16, "span_id": "ef" * 8, "attributes": {}}],
        status={"code": "ERROR", "message": "boom"}),
        span(2, parent=1, name="b", kind="INTERNAL", scope="other", events=[], links=[],
             status={"code": "UNSET", "message": ""})]
    store = SpanStore(tmp_path / "store")
    store.add_spans(spans)
    store.close()
    out = tmp_path / "export.json"
    assert cli.main(["export", str(tmp_path / "store"), "-o", str(out)]) == 0
    assert load_spans(out) == load_spans(tmp_path / "store")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["sink", "--dir", "x", "--http-port", "70000"], "not in 0-65535"),
    (["sink", "--dir", "x", "--grpc-port", "99999"], "not in -1-65535"),
    (["sink", "--dir", "x", "--http-port", "http"], "not a port number"),
    (["sink", "--dir", "x", "--host", "10.1.2.3"], "non-loopback"),
    (["tree", "x", "--max-depth", "-3"], "is negative"),
])
def test_cli_arguments_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    result = _cli(*[a if a != "x" else str(tmp_path / "s") for a in args])
    assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_sink_port_in_use_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _cli("sink", "--dir", str(tmp_path), "--http-port", str(port))
    assert result.returncode == 2 and "otel-ttft sink:" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("http://localhost:99999", False),  # a port out of range: not reachable, and no crash
    ("localhost:-1", False),
    ("http://[::1", False),  # not a URL at all
    ("http://:4318", None),  # no host: nothing to check
    (None, None),  # no endpoint set
])
def test_doctor_bad_endpoint(endpoint: str | None, expected: bool | None) -> None:
    from otel_ttft.tools import doctor

    assert doctor._reachable(endpoint) is expected


def test_doctor_tells_a_listening_endpoint_from_a_closed_one() -> None:
    import socket

    from otel_ttft.tools import doctor

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert doctor._reachable(url) is True
    assert doctor._reachable(url) is False  # closed now: refused


def test_garbage_store_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "telemetry.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    assert cli.main(["tree", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a readable store" in err and len(err.strip().splitlines()) == 1
    assert _cli("sink", "--dir", str(tmp_path), "--http-port", "0").returncode == 2


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", ""])
def test_corrupt_span_row_in_store(tmp_path: Path, capsys, data: str) -> None:
    """A row whose stored JSON was damaged outside the sink: one line naming the span, exit 2."""
    import sqlite3

    store = SpanStore(tmp_path)
    store.add_spans([span(1), span(2, parent=1)])
    store.close()
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("UPDATE spans SET data = ? WHERE span_id = ?", (data, f"{2:016x}"))
    assert cli.main(["tree", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{2:016x}" in err and "data is not" in err, err
