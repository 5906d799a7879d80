"""Every argument checked before a command touches anything: `sink` and `prometheus` create
nothing in a store they refuse, `replay` checks its checkpoints, URLs and directories before it
builds or starts anything, `analyze` gives up on a Tempo that is slow, silent or hostile. Each
bad input is exit 2 with one line (1 only for `check`'s findings), run as a user runs it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_ttft.tools.sink.db import DB_FILE, METRICS_FILE
from tests.analysis_fixture import build_analysis
from tests.hostile_store import assert_refused, cli, snapshot, sql, unchanged


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# --- sink ---------------------------------------------------------------------------------------
def test_sink_refuses_before_creating_the_store(tmp_path: Path, busy_port: int) -> None:
    new = tmp_path / "new" / "store"
    assert_refused(cli("sink", "--dir", str(new), "--host", "10.1.2.3"), "non-loopback")
    assert_refused(cli("sink", "--dir", str(new), "--host", "example.com"), "non-loopback")
    assert_refused(cli("sink", "--dir", str(new), "--http-port", "70000"), "not in 0-65535")
    assert_refused(cli("sink", "--dir", str(new), "--grpc-port", "x"), "not a port number")
    assert_refused(cli("sink", "--dir", str(new), "--http-port", str(busy_port),
                       "--grpc-port", "-1"), "otel-ttft sink:")
    assert not (tmp_path / "new").exists()  # neither the store nor its parent was left behind
    (tmp_path / "file").write_text("x")
    assert_refused(cli("sink", "--dir", str(tmp_path / "file")), "is not a directory")
    assert_refused(cli("sink", "--dir", str(tmp_path / "file" / "store")), "is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_sink_keeps_an_existing_store_it_cannot_serve(store_copy: Path, tmp_path: Path,
                                                      busy_port: int) -> None:
    before = snapshot(tmp_path)
    assert_refused(cli("sink", "--dir", str(store_copy), "--http-port", str(busy_port),
                       "--grpc-port", "-1"), "otel-ttft sink:")
    assert unchanged(before, tmp_path)
    (store_copy / DB_FILE).write_text("not a database")
    assert_refused(cli("sink", "--dir", str(store_copy), "--http-port", "0", "--grpc-port", "-1"),
                   "not a usable store")
    assert (store_copy / DB_FILE).read_text() == "not a database"


# --- prometheus ---------------------------------------------------------------------------------
def test_prometheus_reads_a_store_without_writing_to_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = str(tmp_path / "m.txt")
    assert_refused(cli("prometheus", "--dir", str(empty), "--openmetrics", out), "not a store")
    assert list(empty.iterdir()) == []  # no telemetry.db made in a directory that had none
    assert_refused(cli("prometheus", "--dir", str(tmp_path / "no")), "no such directory")
    for args, needle in ((["--port", "70000"], "not in 0-65535"), (["--expire", "nan"], "finite"),
                         (["--shift", "x"], "not a number"), (["--host", "10.0.0.1"],
                                                               "non-loopback")):
        assert_refused(cli("prometheus", "--dir", str(empty), *args), needle)
    os.mkfifo(empty / METRICS_FILE)  # an earlier version's metrics file, as a FIFO: no hang
    assert_refused(cli("prometheus", "--dir", str(empty), "--openmetrics", out),
                   "named pipe (FIFO)")
    assert not Path(out).exists()


@pytest.mark.parametrize("data, needle", [
    ("{broken", "data is not JSON"), ('"a string"', "not a JSON object"),
    ('{"name": 5}', "no text 'name'"),
    ('{"name": "m", "type": "histogram", "bucket_counts": ["1"], "explicit_bounds": [1]}',
     "'bucket_counts' is not a list of numbers"),
    ('{"name": "m", "type": "gauge", "value": "high"}', "'value' is text, not a number"),
    ('{"name": "m", "time_ns": -1}', "'time_ns' is not a count or time"),
    ('{"name": "m", "type": "histogram"}', "a histogram without"),
])
def test_prometheus_damaged_metric_row(store_copy: Path, tmp_path: Path, data: str,
                                       needle: str) -> None:
    sql(store_copy, "UPDATE metric_points SET data = ? WHERE id = 1", (data,))
    out = tmp_path / "m.txt"
    assert_refused(cli("prometheus", "--dir", str(store_copy), "--openmetrics", str(out)),
                   str(store_copy / DB_FILE), "metric point row 1", needle)
    assert not out.exists()


# --- report and check ---------------------------------------------------------------------------
def test_report_and_check_inputs(tmp_path: Path, store_copy: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps(build_analysis(repeat=1)))
    assert_refused(cli("report", str(store_copy), "-o", str(tmp_path / "r.html")),
                   "is a directory")
    fifo = tmp_path / "t.toml"
    os.mkfifo(fifo)
    assert_refused(cli("check", str(good), str(good), "--thresholds", str(fifo)),
                   "named pipe (FIFO)")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        assert_refused(cli("check", str(tmp_path / "sock"), str(good)), "a socket")
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(build_analysis({"load.read": 3.0}, repeat=1)))
    regression = cli("check", str(worse), str(good))
    assert regression.returncode == 1 and "Traceback" not in regression.stderr  # a finding
    assert not (tmp_path / "r.html").exists()


# --- analyze against a Tempo --------------------------------------------------------------------
class _Tempo(BaseHTTPRequestHandler):
    mode = "trickle"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.mode == "silent":
            time.sleep(30)
            return
        if self.mode == "deep":
            body = ("[" * 100_000 + "]" * 100_000).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        for _ in range(100):  # one byte every 0.2 s: each read is quick, the answer never ends
            self.wfile.write(b" ")
            self.wfile.flush()
            time.sleep(0.2)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("mode, needle", [("trickle", "no complete answer within 1 s"),
                                          ("silent", "ReadTimeout"),
                                          ("deep", "nested too deeply")])
def test_analyze_gives_up_on_a_slow_or_hostile_tempo(mode: str, needle: str) -> None:
    handler = type("Handler", (_Tempo,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        began = time.monotonic()
        proc = cli("analyze", url, "--timeout", "1", timeout=30)
        assert_refused(proc, f"{url}/api/search", needle)
        assert time.monotonic() - began < 20  # the timeout, not the server, ended it
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url, needle", [
    ("http://[::1", "not a valid URL"), ("http://127.0.0.1:99999", "not a valid URL"),
    ("https://", "not an http(s) URL"), ("HTTP://127.0.0.1:1", "ConnectError"),
])
def test_analyze_bad_tempo_urls(url: str, needle: str, tmp_path: Path) -> None:
    assert_refused(cli("analyze", url, "--json", str(tmp_path / "a.json")), needle)
    assert_refused(cli("analyze", "http://127.0.0.1:1", "--timeout", "0"), "--timeout: must be")
    assert list(tmp_path.iterdir()) == []


# --- replay -------------------------------------------------------------------------------------
@pytest.fixture
def checkpoints(tmp_path: Path) -> dict[str, Path]:
    """A directory that is no checkpoint, one with a config but no weights, a file."""
    empty, no_weights = tmp_path / "empty", tmp_path / "config-only"
    empty.mkdir()
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    (tmp_path / "file").write_text("x")
    return {"empty": empty, "no_weights": no_weights, "file": tmp_path / "file"}


def test_replay_checks_every_argument_before_building_anything(tmp_path: Path,
                                                              checkpoints: dict) -> None:
    out = str(tmp_path / "out")
    cases = [
        (["--model-a", "/nonexistent"], "--model-a: /nonexistent: no such directory"),
        (["--model-b", "/nonexistent"], "--model-b: /nonexistent: no such directory"),
        (["--model-a", str(checkpoints["empty"])], "not a checkpoint (no config.json)"),
        (["--model-a", str(checkpoints["no_weights"])], "not a checkpoint (no weights"),
        (["--model-a", str(checkpoints["file"])], "not a directory"),
        (["--tokenizer", "/nonexistent"], "--tokenizer: /nonexistent: no such directory"),
        (["--adapter", "a=/nonexistent"], "no such directory"),
        (["--adapter", "a="], "NAME=PATH"),
        (["--url-a", "http://[::1", "--driver", "resident"], "--url-a: not a valid URL"),
        (["--proxy-url", "ftp://x", "--driver", "proxy"], "not an http(s) URL"),
        (["--out", str(checkpoints["file"])], "is not a directory"),
        (["--start-timeout", "inf"], "--start-timeout: must be > 0 s"),
        (["--request-timeout", "nan"], "--request-timeout: must be > 0 s"),
        (["--max-model-len", "8"], "must be >= 16"),
        (["--concurrency", "65"], "load test"),
        (["--driver", "resident", "--otlp-endpoint", "http://[::1"], "not a valid URL"),
    ]
    for args, needle in cases:
        proc = cli("replay", "--out", out, *args)
        assert_refused(proc, "otel-ttft replay: ", needle)
        assert "tokenizer" not in proc.stderr or "--tokenizer" in args
    assert not (tmp_path / "out").exists()  # nothing created, nothing built


def test_demo_out_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_refused(cli("demo", "--out", str(tmp_path / "file")), "is not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
