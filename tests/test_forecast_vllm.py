"""The forecast against real vLLM (CPU build, the two tiny models), restart driver.

One replay of ``cold-switch`` and ``switch-back``, three repeats (seven server starts: A, then B
and A per repeat). Each switch's forecast is recorded just before the switch; by the third
repeat each model has two starts or more behind it, and its forecast must come within 25 % of
the client TTFT ``analyze`` measured, with the same largest stage. Then A's checkpoint leaves
the page cache: its forecast's load grows before any start, and one more start of A confirms the
forecast within 25 %. A model never started says "no history".

The cheapest honest run: eager servers (``--enforce-eager``: a torch.compile would add a minute
per start and compile nothing the forecast is checked on), one request per activation counted
as cold (``OTEL_TTFT_COLD_REQUESTS=1``, so each start's first request is kept in the history
before the next switch), private copies of both checkpoints (no other test's read warms them).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from otel_ttft import semconv
from otel_ttft.runtime import activation_history as history
from otel_ttft.runtime.hooks.load import pagecache
from otel_ttft.tools import cli, tiny_model
from otel_ttft.tools.forecast import forecast_for
from otel_ttft.tools.replay.command import run_argv
from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE, expand
from otel_ttft.tools.replay.evict import private_copy
from otel_ttft.tools.replay.server import HOST, VllmServer, free_port, telemetry_env
from tests.vllm_args import EAGER_ARGS

pytestmark = pytest.mark.vllm

EAGER = DEFAULT_TEMPLATE + " " + " ".join(EAGER_ARGS)
WITHIN = 0.25
SERVICE = "vllm-forecast-a"  # the last start's server, apart from the replay's
REPEATS = 3


def _first_token_s(url: str, name: str) -> float:
    """One streamed completion; seconds to its first content chunk."""
    body = {"model": name, "prompt": "Hello there", "max_tokens": 4, "stream": True,
            "temperature": 0}
    sent = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.monotonic() - sent
    raise AssertionError("no first chunk")


def _print_history(path: Path, say) -> None:
    """Each record, for the log: what the forecasts rested on."""
    for r in history.load(path).records:
        top = sorted(r["stages"].items(), key=lambda kv: -kv[1])[:3]
        first = ((r.get("cold") or {}).get("first") or {}).get("ttft_s")
        say(f"  {r.get('kind')} {r.get('model')} {r['duration_s']:.2f} s "
              f"started_at {r.get('started_at')} ended_at {r.get('ended_at')} first {first} "
              f"resident {(r.get('evidence') or {}).get('page_cache_resident_ratio')} "
              + " ".join(f"{k} {v:.2f}" for k, v in top))


def _evict(ckpt: Path) -> float:
    files = [f for f in ckpt.iterdir() if f.suffix == ".safetensors"]
    for _ in range(5):
        for f in files:
            pagecache.evict(f)
        ratios = [pagecache.resident_ratio(f) or 0.0 for f in files]
        if max(ratios) < 0.05:
            return max(ratios)
        time.sleep(0.5)
    return max(ratios)


@pytest.mark.acceptance
def test_the_forecast_of_the_next_start_comes_true(receiver, tmp_path, monkeypatch, capsys):
    path = tmp_path / "activations.json"
    monkeypatch.setenv("OTEL_TTFT_VERDICT_HISTORY", str(path))
    monkeypatch.setenv("OTEL_TTFT_COLD_REQUESTS", "1")
    model_a = private_copy(tiny_model.ensure_tiny_model(), tmp_path / "a")
    name_a, name_b = model_a.name, tiny_model.MODEL_B_NAME
    rc = run_argv(["--scenarios", "cold-switch,switch-back", "--repeat", str(REPEATS),
                   "--otlp-endpoint", receiver.http_endpoint, "--out", str(tmp_path / "logs"),
                   "--max-tokens", "4", "--model-a", str(model_a), "--serve-a", EAGER,
                   "--serve-b", EAGER])
    assert rc == 0, f"replay failed; server logs in {tmp_path / 'logs'}"
    capsys.readouterr()

    def say(text: str) -> None:  # the log of what was measured, past capsys
        with capsys.disabled():
            print(text, flush=True)

    _print_history(path, say)

    # analyze: forecast against actual, per stage, for every switch the replay made
    out = tmp_path / "analysis.json"
    store = str(receiver.store.directory)

    def analyzed() -> dict | None:
        if cli.main(["analyze", store, "--json", str(out)]) != 0:
            return None
        doc = json.loads(out.read_text())
        done = [r for r in doc["requests"] if r.get("forecast")]
        return doc if len(done) == 2 * REPEATS else None

    deadline, doc = time.monotonic() + 60, None
    while doc is None and time.monotonic() < deadline:
        doc = analyzed()
        if doc is None:
            time.sleep(2)
    assert doc is not None, "the switching requests' spans did not all arrive"
    table = capsys.readouterr().out
    say(table[table.find("Forecast against actual"):])
    assert "Forecast against actual" in table
    rows = {(r["scenario"], r["repeat_index"]): r for r in doc["requests"] if r.get("forecast")}
    assert rows[("cold-switch", 0)]["forecast"]["status"] == "no history"  # B's first start
    assert rows[("cold-switch", 0)]["forecast"].get("total_s") is None
    for scenario in ("cold-switch", "switch-back"):
        r = rows[(scenario, REPEATS - 1)]
        f = r["forecast"]
        say(f"{scenario}: forecast {f['total_s']:.2f} s ({f['basis_count']} starts), actual "
              f"{r['client_ttft_s']:.2f} s; stages forecast {f['stages']}, actual {r['stages']}")
        assert f["status"] == "forecast" and f["basis_count"] >= 2, f
        assert abs(f["error"]) <= WITHIN, (scenario, f, r["stages"])
        assert f["largest_forecast"] == f["largest_actual"], (scenario, f, r["stages"])
        assert f["stages"].get("switch", 0) > 0  # the outgoing server's measured evictions

    # the command, as an operator runs it (B, with A leaving first)
    assert cli.main(["forecast", "--history", str(path), "--no-device", "--from", name_a,
                     "--model", name_b, "--model", "never-started-model"]) == 0
    printed = capsys.readouterr().out
    say(printed)
    assert "never-started-model: no history" in printed

    # A's checkpoint leaves the page cache: its load forecast grows before any start
    warm = forecast_for(name_a, path=str(path), alone=True)
    resident = _evict(model_a)
    if resident >= 0.05:
        pytest.skip(f"the page cache kept {resident:.0%} of A's private copy")
    cold = forecast_for(name_a, path=str(path), alone=True)
    assert cold["conditions"]["resident_ratio"] < 0.05 < warm["conditions"]["resident_ratio"]
    assert cold["stages"]["load"]["expected_s"] > warm["stages"]["load"]["expected_s"], (warm,
                                                                                           cold)
    grown = cold["substages"]["load.read"]["expected_s"] - warm["substages"]["load.read"][
        "expected_s"]
    say(f"A cold: load.read forecast {cold['substages']['load.read']['expected_s']:.3f} s "
          f"(+{grown:.3f} s), total {cold['total_s']:.2f} s; basis {cold['basis']}")

    # ... and the next start of A confirms it
    port = free_port()
    argv = expand(EAGER, model=str(model_a), name=name_a, port=port, host=HOST,
                  python=sys.executable,
                  instrument=str(Path(sys.executable).parent / "opentelemetry-instrument"))
    began = time.monotonic()
    server = VllmServer(model_a, port=port, argv=argv, poll_s=0.1,
                        env={**telemetry_env(receiver.http_endpoint),
                             "OTEL_SERVICE_NAME": SERVICE},
                        log_path=tmp_path / "logs" / "vllm-a-cold.log")
    with server:
        ready = time.monotonic() - began
        measured = ready + _first_token_s(server.url, name_a)

        # the running server (A) exports B's forecast, A leaving first, over real OTLP (and
        # none of its own model)
        def forecast_points(model: str) -> list[dict]:
            return [p for p in receiver.store.metric_points()
                    if p["name"] == semconv.METRIC_SWITCH_FORECAST
                    and p["resource"].get("service.name") == SERVICE
                    and p["attributes"].get(semconv.GEN_AI_REQUEST_MODEL) == model]
        receiver.wait_for_spans(lambda _spans: forecast_points(name_b), 60)
        stages = {p["attributes"][semconv.ATTR_STAGE] for p in forecast_points(name_b)}
        assert {"switch", "warmup", semconv.FORECAST_STAGE_TOTAL} <= stages, stages
        assert forecast_points(name_a) == []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the start's record, with its first request
            last = [r for r in history.load(path).records
                    if r.get("model") == name_a and r.get("kind") == "start"][-1]
            if (last.get("cold") or {}).get("first"):
                break
            time.sleep(1)
    say(f"A cold start: measured {measured:.2f} s, forecast {cold['total_s']:.2f} s; load.read "
          f"measured {last['stages'].get('load.read', 0):.3f} s, resident "
          f"{last['evidence']['page_cache_resident_ratio']}")
    assert last["evidence"]["page_cache_resident_ratio"] < 0.5  # it did read from storage
    assert abs(cold["total_s"] - measured) / measured <= WITHIN, (cold, measured)

    # a model never started here: "no history", never a number
    never = forecast_for("never-started-model", path=str(path))
    assert never["status"] == "no history" and never["total_s"] is None
