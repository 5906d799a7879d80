"""The forecast of each model's next first token: the pure model on history records, its readers
on real files (a checkpoint evicted from the page cache, a compile cache emptied), the server's
gauge, ``otel-ttft forecast`` on good and hostile histories, and the analysis's comparison.

Real vLLM starts are in ``tests/test_forecast_vllm.py``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.diagnosis import forecast as model
from otel_ttft.runtime import activation_history as history
from otel_ttft.runtime.hooks import forecast_conditions as conditions
from otel_ttft.runtime.hooks import forecast_gauge
from otel_ttft.runtime.hooks.load import pagecache
from otel_ttft.runtime.state import PartSpec, ProcessState
from otel_ttft.tools import cli
from otel_ttft.tools.analysis import forecast_check
from tests.request_engine import current_config

MB = 1_000_000


def start(key: str, name: str, ckpt: str, *, at: float, load_read: float, read_bytes: int,
          shard_bytes: int, process_start: float = 10.0, compile_s: float = 0.0,
          compile_hit: bool | None = None, compile_dir: str | None = None,
          prefill: float = 0.05) -> dict:
    stages = {"warmup.process_start": process_start, "load.read": load_read, "load": 0.2,
              "warmup": 1.0}
    if compile_s:
        stages["warmup.compile"] = compile_s
    return {"id": f"{name}{at}", "key": key, "model": name, "kind": "start", "at": at,
            "duration_s": sum(stages.values()), "stages": stages,
            "evidence": {"bytes_read": read_bytes, "shard_bytes": shard_bytes,
                         "page_cache_resident_ratio": 1 - read_bytes / shard_bytes,
                         "compile_cache_hit": compile_hit},
            "facts": {"compile_cache_dir": compile_dir} if compile_dir else {},
            "config": {"model_config.model": ckpt},
            "cold": {"requests": 3, "ttft_s": 0.3, "stages": {"prefill": 0.15},
                     "first": {"ttft_s": prefill, "stages": {"prefill": prefill}}}}


def switch_record(name: str, seconds: float, at: float) -> dict:
    return {"id": f"s{name}{at}", "key": f"switch:{name}", "model": name, "kind": "switch",
            "at": at, "duration_s": seconds, "stages": {"switch": seconds}, "evidence": {},
            "facts": {}}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint directory with two 4 MB weight files, written back to disk."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for i in range(2):
        path = ckpt / f"model-{i}.safetensors"
        path.write_bytes(os.urandom(4 * MB))
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return ckpt


def _warm(ckpt: Path) -> None:
    for f in ckpt.iterdir():
        f.read_bytes()


def _cold(ckpt: Path) -> float:
    for _ in range(5):
        for f in ckpt.iterdir():
            pagecache.evict(f)
        ratio = conditions.page_cache(conditions.shard_files(ckpt)).resident_ratio
        if ratio is not None and ratio < 0.05:
            return ratio
        time.sleep(0.2)
    pytest.skip(f"the page cache kept the files ({ratio})")


def _history(ckpt_a: Path, ckpt_b: str = "/nonexistent/b") -> list[dict]:
    """A read warm twice, B read cold twice (its reads cost 2 s per 8 MB); A's server left in
    3 s and 4 s."""
    return [
        start("ka", "A", str(ckpt_a), at=1, load_read=0.1, read_bytes=0, shard_bytes=8 * MB),
        start("kb", "B", ckpt_b, at=2, load_read=2.1, read_bytes=8 * MB, shard_bytes=8 * MB,
              process_start=20.0),
        switch_record("A", 3.0, 2.5),
        start("ka", "A", str(ckpt_a), at=3, load_read=0.1, read_bytes=0, shard_bytes=8 * MB),
        start("kb", "B", ckpt_b, at=4, load_read=2.1, read_bytes=8 * MB, shard_bytes=8 * MB,
              process_start=22.0),
        switch_record("A", 4.0, 4.5),
    ]


def test_a_model_never_started_here_says_no_history_never_a_number(checkpoint):
    (found,) = conditions.forecasts(_history(checkpoint), conditions.Host(), only=["C"])
    assert found.status == model.NO_HISTORY and found.total_s is None and not found.stages
    assert found.as_dict()["total_s"] is None
    assert model.forecast("C", [], model.Conditions()).status == model.NO_HISTORY


def test_the_forecast_is_the_stages_medians_plus_the_outgoing_servers_eviction(checkpoint):
    _warm(checkpoint)
    (b,) = conditions.forecasts(_history(checkpoint), conditions.Host(), only=["B"],
                                outgoing="A")
    assert b.status == "forecast" and b.basis_count == 2
    # the switch is A's eviction (median of 3 s and 4 s), the rest B's own starts' medians
    assert b.stages["switch"].expected_s == pytest.approx(3.5)
    assert b.substages["warmup.process_start"].expected_s == pytest.approx(21.0)
    assert b.stages["prefill"].expected_s == pytest.approx(0.05)  # the first request's own
    assert b.total_s == pytest.approx(sum(s.expected_s for s in b.stages.values()))
    assert b.largest_stage() == "warmup"
    assert b.low_s <= b.total_s <= b.high_s
    assert any("thin basis" in line for line in b.basis)
    # with nothing to evict, no switch
    (b_alone,) = conditions.forecasts(_history(checkpoint), conditions.Host(), only=["B"])
    assert "switch" not in b_alone.stages


def test_evicting_the_checkpoint_grows_the_load_stage_before_any_start(checkpoint):
    records = _history(checkpoint)
    _warm(checkpoint)
    (warm,) = conditions.forecasts(records, conditions.Host(), only=["A"])
    assert warm.conditions.resident_ratio > 0.9
    assert warm.substages["load.read"].expected_s == pytest.approx(0.1, abs=0.01)
    _cold(checkpoint)
    (cold,) = conditions.forecasts(records, conditions.Host(), only=["A"])
    assert cold.conditions.resident_ratio < 0.05 and cold.conditions.checkpoint_bytes == 8 * MB
    # A was only ever read warm: B's cold reads give this host's storage cost (2.1 s / 8 MB)
    grown = cold.substages["load.read"].expected_s - warm.substages["load.read"].expected_s
    assert grown == pytest.approx(2.1 * (1 - cold.conditions.resident_ratio), rel=0.1)
    assert cold.stages["warmup"].expected_s == warm.stages["warmup"].expected_s  # only load
    assert any("storage cost from cold reads" in line for line in cold.basis)


def test_a_model_read_cold_and_warm_moves_along_its_own_line(checkpoint):
    records = [start("ka", "A", str(checkpoint), at=i, load_read=0.1 + 1.0 * (i % 2),
                     read_bytes=8 * MB * (i % 2), shard_bytes=8 * MB) for i in range(4)]
    _warm(checkpoint)
    (warm,) = conditions.forecasts(records, conditions.Host())
    _cold(checkpoint)
    (cold,) = conditions.forecasts(records, conditions.Host())
    assert warm.substages["load.read"].expected_s == pytest.approx(0.1, abs=0.02)
    assert cold.substages["load.read"].expected_s == pytest.approx(1.1, abs=0.05)


def test_emptying_the_compile_cache_changes_the_compile_stage(checkpoint, tmp_path):
    cache = tmp_path / "torch_compile_cache" / "abc"
    cache.mkdir(parents=True)
    (cache / "artifact.bin").write_bytes(b"x")
    records = [start("ka", "A", str(checkpoint), at=1, load_read=0.1, read_bytes=0,
                     shard_bytes=8 * MB, compile_s=30.0, compile_hit=False,
                     compile_dir=str(cache)),
               start("ka", "A", str(checkpoint), at=2, load_read=0.1, read_bytes=0,
                     shard_bytes=8 * MB, compile_s=3.0, compile_hit=True,
                     compile_dir=str(cache)),
               start("ka", "A", str(checkpoint), at=3, load_read=0.1, read_bytes=0,
                     shard_bytes=8 * MB, compile_s=3.2, compile_hit=True,
                     compile_dir=str(cache))]
    _warm(checkpoint)
    (full,) = conditions.forecasts(records, conditions.Host())
    assert full.conditions.compile_cache_ready is True
    assert full.substages["warmup.compile"].expected_s == pytest.approx(3.1)
    (cache / "artifact.bin").unlink()
    (empty,) = conditions.forecasts(records, conditions.Host())
    assert empty.conditions.compile_cache_ready is False
    assert empty.substages["warmup.compile"].expected_s == pytest.approx(30.0)
    assert empty.substages["load.read"] == full.substages["load.read"]


def test_a_running_server_of_another_model_is_the_one_that_leaves():
    argv = ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/a",
            "--served-model-name", "A", "--port", "1"]
    assert conditions.served_names(argv) == ("/m/a", "A")
    assert conditions.served_names(["/v/bin/vllm", "serve", "org/m", "--port", "1"]) == ("org/m",)
    assert conditions.served_names(["python", "train.py", "--model", "x"]) == ()
    me = conditions.running_servers()  # this host's: whatever runs, never an error
    assert all(s.pid > 0 and s.names for s in me)


def _write_history(path: Path, records: list[dict]) -> None:
    path.write_text(json.dumps({"format": history.FORMAT, "version": history.VERSION,
                                "records": records}))


def test_the_command_prints_a_table_and_writes_json(checkpoint, tmp_path, capsys):
    path = tmp_path / "activations.json"
    _write_history(path, _history(checkpoint))
    out = tmp_path / "forecast.json"
    rc = cli.main(["forecast", "--history", str(path), "--no-device", "--from", "A",
                   "--model", "B", "--model", "C", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "B: " in text and "largest stage warmup" in text and "C: no history" in text
    doc = json.loads(out.read_text())
    b, c = doc["forecasts"]
    assert b["status"] == "forecast" and b["stages"]["switch"]["expected_s"] == 3.5
    assert c["status"] == "no history" and c["total_s"] is None
    assert cli.main(["forecast", "--history", str(tmp_path / "none.json"), "--no-device"]) == 0
    assert "no model has a forecast" in capsys.readouterr().out


@pytest.mark.parametrize("content", [b"garbage", b'{"format": "otel-ttft-activation-hist',
                                     b"[1, 2]", b"x" * (history.MAX_BYTES + 10), "fifo"])
def test_a_history_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "activations.json"
    if content == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    rc = cli.main(["forecast", "--history", str(path), "--no-device"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("otel-ttft forecast: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_the_gauge_reports_the_other_models_of_this_host(checkpoint, tmp_path, monkeypatch):
    path = tmp_path / "activations.json"
    _write_history(path, _history(checkpoint))
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(path))
    state = ProcessState(current_config(), [PartSpec(forecast_gauge.PART,
                                                     forecast_gauge.ForecastGauge)])
    state.identity.served_model = "A"  # this server's model
    part = state.part(forecast_gauge.PART)
    try:
        part.on_ready()
        part._reading.join(60)
        points = list(part._observe(None))
        models = {p.attributes[semconv.GEN_AI_REQUEST_MODEL] for p in points}
        assert models == {"B"}  # A is this server's own
        total = {p.attributes[semconv.ATTR_FORECAST_BOUND]: p.value for p in points
                 if p.attributes[semconv.ATTR_STAGE] == semconv.FORECAST_STAGE_TOTAL}
        assert total["low"] <= total["expected"] <= total["high"]
        switch = [p for p in points if p.attributes[semconv.ATTR_STAGE] == "switch"]
        assert switch[0].value == pytest.approx(3.5)  # this server (A) leaving first
        # its own eviction joins the history for the next forecasts
        part.note_eviction(0, 2_500_000_000)
        assert model.evictions(history.load(path).records, "A") == [3.0, 4.0, 2.5]
    finally:
        state.close()
    assert list(part._observe(None)) == []


@pytest.mark.parametrize("value", [None, 3, "not json", "[1]", '{"status": 1}',
                                   '{"status": "forecast", "total_s": -1, "stages": []}',
                                   '{"status": "forecast", "total_s": 1e400}'])
def test_the_analysis_keeps_only_a_forecast_it_can_compare(value):
    parsed = forecast_check.parse(value)
    assert parsed is None or (parsed["total_s"] is None and parsed["stages"] == {})


def test_the_analysis_puts_the_forecast_beside_the_measured_stages():
    f = forecast_check.parse(json.dumps({
        "status": "forecast", "total_s": 10.0, "low_s": 8.0, "high_s": 12.0, "basis_count": 2,
        "stages": {"switch": {"expected_s": 2.0}, "warmup": {"expected_s": 8.0}}}))
    record = {"client_ttft_s": 11.0, "stages": {"switch": 1.0, "warmup": 9.5, "load": 0.5}}
    got = forecast_check.compare(f, record)
    assert got["error"] == pytest.approx(-1 / 11, abs=1e-3) and got["within_range"] is True
    assert got["largest_forecast"] == got["largest_actual"] == "warmup"


def test_the_switch_counts_the_swappers_handover_after_the_eviction(checkpoint):
    """The outgoing server's span ends at its exit handler; the next start's exec comes later
    (the process's last teardown, the swapper's spawn): measured between the records."""
    records = _history(checkpoint)
    ended = iter((100.0, 300.0))  # A's two evictions ended then
    began = iter((50.0, 102.0, 250.0, 500.0))  # A, B 2 s after the first, A, B much later
    for r in records:
        if r["kind"] == "switch":
            r["ended_at"] = next(ended)
        else:
            r["started_at"] = next(began)
    assert model.handovers(records) == [2.0]
    (b,) = conditions.forecasts(records, conditions.Host(), only=["B"], outgoing="A")
    assert b.stages["switch"].expected_s == pytest.approx(3.5 + 2.0)
    assert any("until the next start's exec" in line for line in b.basis)


def test_the_report_shows_forecast_and_actual_side_by_side():
    from otel_ttft.tools.analysis.contract import parse_analysis
    from otel_ttft.tools.analysis.report import render_report
    from tests.analysis_fixture import build_analysis

    doc = build_analysis()
    request = next(r for r in doc["requests"] if r["scenario"] == "cold-switch")
    f = forecast_check.parse(json.dumps({
        "status": "forecast", "total_s": 12.5, "low_s": 10.0, "high_s": 15.0, "basis_count": 2,
        "stages": {"warmup": {"expected_s": 9.75}, "load": {"expected_s": 2.75}}}))
    request["forecast"] = forecast_check.compare(f, request)
    html = render_report(parse_analysis(json.dumps(doc).encode(), "analysis.json"))
    table = html[html.index('id="forecasts"'):]
    table = table[:table.index("</table>")]
    assert "cold-switch" in table and "12.5" in table and "9.75" in table
    assert "Forecast against actual" in html


def test_a_sleeping_server_of_the_model_is_read_and_said(checkpoint):
    """vLLM's ``/is_sleeping`` (a dev endpoint; sleep mode needs a GPU, so a stand-in answers
    here as vLLM's router does)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"is_sleeping": self.path == "/is_sleeping"}).encode()
            self.send_response(200 if self.path == "/is_sleeping" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert conditions.is_sleeping(port) is True
        server_of_a = conditions.RunningServer(4242, ("A",), port, sleeping=True)
        (a,) = conditions.forecasts(_history(checkpoint), conditions.Host((server_of_a,)),
                                    only=["A"])
        assert a.conditions.sleeping is True
        assert any("a wake-up" in line for line in a.basis)
        assert any("pid 4242 (asleep" in line for line in a.conditions.notes)
    finally:
        server.shutdown()
    assert conditions.is_sleeping(port) is None  # nobody answers: unknown, never an error
    args = ["python", "-m", "vllm.entrypoints.openai.api_server", "--port=8123"]
    assert conditions._port(args) == 8123
