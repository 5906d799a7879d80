"""`analyze http://tempo:3200`: TraceQL search, then each trace by id, over real HTTP against a
local server answering as Tempo documents it (Tempo itself cannot run here)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from otel_ttft.tools import cli
from otel_ttft.tools.analysis.source import SourceError, iter_traces
from tests import analysis_fixtures as fx


def _value(v: object) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def tempo_v1_trace(spans: list[dict]) -> dict:
    """GET /api/traces/<id> as Tempo v1 answers: ``batches``, ids in base64."""
    return {"batches": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{"scope": {"name": "otel-ttft"}, "spans": [{
            "traceId": _b64(s["trace_id"]), "spanId": _b64(s["span_id"]),
            **({"parentSpanId": _b64(s["parent_span_id"])} if s["parent_span_id"] else {}),
            "name": s["name"], "kind": f"SPAN_KIND_{s['kind']}",
            "startTimeUnixNano": str(s["start_ns"]), "endTimeUnixNano": str(s["end_ns"]),
            "attributes": [{"key": k, "value": _value(v)} for k, v in s["attributes"].items()],
            "links": [{"traceId": _b64(lk["trace_id"]), "spanId": _b64(lk["span_id"]),
                       "attributes": [{"key": k, "value": _value(v)}
                                      for k, v in lk["attributes"].items()]}
                      for lk in s["links"]],
        } for s in spans]}],
    }]}


class FakeTempo(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, traces: dict[str, list[dict]], v2: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.traces, self.v2, self.queries = traces, v2, []


class _Handler(BaseHTTPRequestHandler):
    server: FakeTempo

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        if url.path == "/api/search":
            self.server.queries.append(parse_qs(url.query))
            self._json(200, {"traces": [{"traceID": t, "rootServiceName": "vllm",
                                         "rootTraceName": "x", "durationMs": 1}
                                        for t in self.server.traces], "metrics": {}})
        elif url.path.startswith("/api/traces/"):
            spans = self.server.traces.get(url.path.rsplit("/", 1)[1])
            if spans is None:
                self._json(404, {"error": "trace not found"})
                return
            body = tempo_v1_trace(spans)
            if self.server.v2:
                body = {"trace": {"resourceSpans": body["batches"]}, "status": "complete"}
            self._json(200, body)
        elif url.path == "/garbage/api/search":
            self._json(200, ["not", "a", "search"])
        else:
            self._json(404, {"error": "no such endpoint"})


@pytest.fixture(params=[False, True], ids=["v1-batches", "v2-resourceSpans"])
def tempo(request: pytest.FixtureRequest) -> Iterator[FakeTempo]:
    by_trace: dict[str, list[dict]] = {}
    for s in fx.cold_switch_run(read=20.0):
        by_trace.setdefault(s["trace_id"], []).append(s)
    server = FakeTempo(by_trace, v2=request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_analyze_reads_a_tempo(tempo: FakeTempo, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{tempo.server_address[1]}"
    traces = list(iter_traces(url, since_s=3600, limit=50))
    assert sorted(s["trace_id"] for t in traces for s in t[:1]) == sorted(tempo.traces)
    query = tempo.queries[-1]
    assert 'name = "llm_request"' in query["q"][0] and query["limit"] == ["50"]
    assert int(query["end"][0]) - int(query["start"][0]) == 3600
    assert cli.main(["analyze", url]) == 0
    out = capsys.readouterr().out
    assert "cold-switch" in out and "load.read" in out and "keep-resident" in out


def test_unreachable_or_garbage_tempo_exits_2(tempo: FakeTempo,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SourceError):
        list(iter_traces(f"http://127.0.0.1:{tempo.server_address[1]}/garbage"))
    assert cli.main(["analyze", f"http://127.0.0.1:{tempo.server_address[1]}/nothing"]) == 2
    assert cli.main(["analyze", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("otel-ttft analyze:") == 2
