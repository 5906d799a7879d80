"""``otel-ttft demo``: the whole loop on one machine, for someone who has never used the tool.

Build the two tiny models (and two LoRA adapters), start the embedded OTLP receiver, replay the six
scenarios through the restart driver against real vLLM servers under ``opentelemetry-instrument``,
then analyze what arrived. Whatever happens, the collected telemetry stays on disk and we say where.

Server starts are the cost here (about a minute each on 2 cores), so the scenario order reuses
them: A (with LoRA enabled) -> B cold -> A again -> B beside A -> A alone for the prompts and
adapters: four starts in all.
"""

from __future__ import annotations

import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TextIO

from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import STORE_FILES, SpanStore

DEFAULT_OUT = Path("out/demo")
ANALYSIS_FILE = "analysis.json"
REPORT_FILE = "report.html"
# Signal-specific variables from the user's shell would override ours and send data elsewhere.
_UNSET = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")


def telemetry_env(endpoint: str) -> dict[str, str | None]:
    """Environment that makes every vLLM process export to ``endpoint`` over OTLP/HTTP."""
    env: dict[str, str | None] = dict.fromkeys(_UNSET)
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm-demo",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "none",
    })
    return env


def _wait_quiet(store: SpanStore, quiet_s: float = 1.5, max_s: float = 15.0) -> list[dict]:
    """Spans once the count has stopped growing (exporters flush as processes exit)."""
    deadline, last, stable_since = time.monotonic() + max_s, -1, time.monotonic()
    while True:
        spans = store.spans()
        now = time.monotonic()
        if len(spans) != last:
            last, stable_since = len(spans), now
        elif now - stable_since >= quiet_s or now >= deadline:
            return spans
        time.sleep(0.25)


def _installed() -> bool:
    try:
        metadata.distribution("otel-ttft")
        return True
    except metadata.PackageNotFoundError:
        return False


def _clear(out: Path, say) -> None:
    old = [p for p in (*(out / n for n in STORE_FILES), out / ANALYSIS_FILE, out / REPORT_FILE,
                       *out.glob("vllm-*.log")) if p.exists()]
    if old:
        say(f"replacing the previous demo data in {out}")
        for path in old:
            path.unlink()


def _analyze_and_report(out_dir: Path, say) -> int:
    """The main job on what the replay stored: the breakdown and verdicts, then the HTML page."""
    from otel_ttft import cli

    say("")
    rc = cli.main(["analyze", str(out_dir), "--json", str(out_dir / ANALYSIS_FILE)])
    if rc == 0:
        rc = cli.main(["report", str(out_dir / ANALYSIS_FILE), "-o", str(out_dir / REPORT_FILE)])
    return rc


def run_demo(out_dir: str | Path = DEFAULT_OUT, *, keep_going: bool = False,
             stream: TextIO | None = None, start_timeout_s: float = 600,
             scenarios: str | None = None) -> int:
    """The demo; returns the process exit code. ``keep_going``: a failed request does not fail
    the demo, as long as the servers came up and telemetry arrived."""
    out = stream or sys.stdout
    say = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    began = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear(out_dir, say)
    if not _installed():
        say("warning: otel-ttft is not installed in this environment (`pip install -e .`), "
            "so opentelemetry-instrument cannot load it; expect vLLM's own spans only")

    from otel_ttft import tiny_model  # heavy imports; only the demo needs them
    from otel_ttft.replay.command import run_argv

    say("building the two tiny models and two LoRA adapters (cached after the first run) ...")
    try:
        tiny_model.ensure_tiny_model()
        tiny_model.ensure_tiny_model_b()
        tiny_model.ensure_lora_adapters()
    except Exception as exc:  # missing transformers/tokenizers, unwritable cache, ...
        say(f"error: could not build the tiny models: {type(exc).__name__}: {exc}")
        return 1
    store = SpanStore(out_dir)
    with OTLPReceiver(store, grpc_port=None) as receiver:
        say(f"OTLP receiver on {receiver.http_endpoint}, storing into {out_dir}")
        argv = ["--driver", "restart", "--out", str(out_dir), "--otlp-endpoint",
                receiver.http_endpoint, "--start-timeout", str(start_timeout_s)]
        if scenarios:
            argv += ["--scenarios", scenarios]
        try:
            rc = run_argv(argv)
        except KeyboardInterrupt:
            say("interrupted")
            rc = 1
        say("waiting for the last spans (servers flush as they exit) ...")
        spans = _wait_quiet(store)
    points = len(store.metric_points())
    say(f"data: {store.spans_path} ({len(spans)} spans), {store.metrics_path} ({points} metric "
        f"points), server logs {out_dir}/vllm-*.log")
    if not spans:
        say("error: no spans arrived; see the server logs for exporter errors")
        return 1
    if rc != 0 and not keep_going:
        say(f"error: the replay failed (exit {rc}); what was collected is kept in {out_dir}")
        return rc
    rc = _analyze_and_report(out_dir, say)
    say(f"render traces again with: otel-ttft tree {out_dir}")
    say(f"demo took {time.monotonic() - began:.0f} s")
    return rc
