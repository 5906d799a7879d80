"""A real replay into an embedded receiver, then ``otel-ttft analyze`` on what arrived: shared
by the tests that judge a replay run end to end (``test_prefix_cache_vllm``,
``test_first_use_vllm``)."""

from __future__ import annotations

import json
from pathlib import Path

from otel_ttft.tools import cli
from otel_ttft.tools.replay.command import run_argv
from otel_ttft.tools.replay.demo import wait_quiet
from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import SpanStore


def replay_and_analyze(tmp: Path, replay_args: list[str]) -> dict:
    """``otel-ttft replay REPLAY_ARGS`` with its spans into ``tmp/store`` (logs in ``tmp/logs``),
    then the analysis of that store, written to ``tmp/analysis.json`` and returned."""
    receiver = OTLPReceiver(SpanStore(tmp / "store"))
    receiver.start()
    try:
        rc = run_argv([*replay_args, "--otlp-endpoint", receiver.http_endpoint,
                       "--out", str(tmp / "logs")])
        assert rc == 0, f"replay failed; logs in {tmp / 'logs'}"
        wait_quiet(receiver.store)
    finally:
        receiver.stop()
    out = tmp / "analysis.json"
    assert cli.main(["analyze", str(tmp / "store"), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def rows(doc: dict, scenario: str) -> list[dict]:
    """The scenario's answered requests (at least one)."""
    found = [r for r in doc["requests"] if r["scenario"] == scenario]
    assert found, f"no answered {scenario} request"
    return found


def verdict(doc: dict, scenario: str) -> dict:
    return next(v for v in doc["verdicts"] if v["scenario"] == scenario)
