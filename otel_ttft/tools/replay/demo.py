"""``otel-ttft demo``: the whole loop on one machine, for someone who has never used the tool.

Build the two tiny models (and two LoRA adapters), start the embedded OTLP receiver, replay the six
scenarios through the restart driver against real vLLM servers under ``opentelemetry-instrument``,
then analyze what arrived. Whatever happens, the collected telemetry stays on disk and we say where.

The servers run with vLLM's default prefix caching, and the replay's chat turns share a long
prefix: after the analysis the demo says how many prompt tokens each scenario read from the cache
and what a switch that emptied it cost (``prefix_cache_lines``).

Server starts are the cost here (about a minute each on 2 cores), so the scenario order reuses
them: A (with LoRA enabled) -> B cold -> A again -> B beside A -> A alone for the prompts and
adapters: four starts in all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import TextIO

from otel_ttft.tools.sink.child import ReceiverProcess
from otel_ttft.tools.sink.store import STORE_FILES, SpanStore

DEFAULT_OUT = Path("out/demo")
ANALYSIS_FILE = "analysis.json"
REPORT_FILE = "report.html"
VERIFY_DIR = "verify"
# What the demo verifies on CPU, (scenario, change): the others cost more starts, or a GPU.
VERIFY_SCENARIOS = (("cold-switch", "compile-cache"), ("switch-back", "resident"))
def wait_quiet(store: SpanStore, quiet_s: float = 1.5, max_s: float = 15.0) -> list[dict]:
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


def prefix_cache_lines(analysis: Path) -> list[str]:
    """What the run measured of vLLM's prefix cache (on: vLLM's default), per scenario: prompt
    tokens read from it, and where a switch emptied it, the tokens the baseline read there that
    were computed again and the prefill they cost (``prefill.uncached_prefix``)."""
    import json
    import statistics

    from otel_ttft import semconv
    from otel_ttft.tools.analysis.tree import format_duration

    try:
        doc = json.loads(analysis.read_text())
    except (OSError, ValueError):
        return []
    by_scenario: dict[str, list[dict]] = {}
    for r in doc.get("requests") or []:
        if isinstance((r.get("evidence") or {}).get("cached_tokens"), int) and \
                r.get("prompt_tokens"):
            by_scenario.setdefault(r["scenario"], []).append(r)
    if not by_scenario:
        return ["prefix cache: no request reported the prompt tokens vLLM read from its cache"]
    lines = ["prefix cache (vLLM's default: on), prompt tokens read from it, p50 per scenario:"]
    for name, rows in by_scenario.items():
        cached = statistics.median(r["evidence"]["cached_tokens"] for r in rows)
        tokens = statistics.median(r["prompt_tokens"] for r in rows)
        line = f"- {name}: {cached:g} of {tokens:g}"
        extra = statistics.median(r["evidence"].get("uncached_prefix_tokens") or 0 for r in rows)
        if extra:
            spent = statistics.median(r["substages"].get(
                semconv.STAGE_PREFILL_UNCACHED_PREFIX, 0.0) for r in rows)
            line += (f"; {extra:g} that its baseline read from the cache were computed again: "
                     f"{format_duration(spent)} of {semconv.STAGE_PREFILL_UNCACHED_PREFIX}")
        lines.append(line)
    return lines


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


def run_demo(out_dir: str | Path = DEFAULT_OUT, *, keep_going: bool = False,
             stream: TextIO | None = None, start_timeout_s: float = 600,
             scenarios: str | None = None,
             analyze: Callable[[Path, Path, Path], int] | None = None,
             verify: Callable[[Path, Path, Path, Sequence[tuple[str, str]]], int] | None = None
             ) -> int:
    """The demo; returns the process exit code. ``keep_going``: a failed request does not fail
    the demo, as long as the servers came up and telemetry arrived. ``analyze(store, analysis,
    report)``: the main job on what the replay stored (the CLI passes its ``analyze`` and
    ``report`` commands; the replay never imports the CLI back). ``verify(analysis, out,
    report, scenarios)``: then try the changes this machine can (the compile cache for the cold
    switch, a resident model for the switch-back) and draw them; printed last."""
    out = stream or sys.stdout
    say = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    began = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear(out_dir, say)
    if not _installed():
        say("warning: otel-ttft is not installed in this environment (`pip install -e .`), "
            "so opentelemetry-instrument cannot load it; expect vLLM's own spans only")

    from otel_ttft.tools import tiny_model  # heavy imports; only the demo needs them
    from otel_ttft.tools.replay.command import run_argv

    say("building the two tiny models and two LoRA adapters (cached after the first run) ...")
    try:
        tiny_model.ensure_tiny_model()
        tiny_model.ensure_tiny_model_b()
        tiny_model.ensure_lora_adapters()
    except Exception as exc:  # missing transformers/tokenizers, unwritable cache, ...
        say(f"error: could not build the tiny models: {type(exc).__name__}: {exc}")
        return 1
    # In a process of its own: its work on a burst of spans would delay the replay's reading
    # of first chunks in this one (``sink.child``).
    with ReceiverProcess(out_dir) as receiver:
        store = receiver.store
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
        spans = wait_quiet(store)
    points = len(store.metric_points())
    say(f"data: {store.spans_path} ({len(spans)} spans), {store.metrics_path} ({points} metric "
        f"points), server logs {out_dir}/vllm-*.log")
    if not spans:
        say("error: no spans arrived; see the server logs for exporter errors")
        return 1
    if rc != 0 and not keep_going:
        say(f"error: the replay failed (exit {rc}); what was collected is kept in {out_dir}")
        return rc
    if analyze is not None:
        say("")
        rc = analyze(out_dir, out_dir / ANALYSIS_FILE, out_dir / REPORT_FILE)
        if rc == 0:
            say("")
            for line in prefix_cache_lines(out_dir / ANALYSIS_FILE):
                say(line)
        wanted = [s for s in VERIFY_SCENARIOS if not scenarios or s[0] in scenarios.split(",")]
        if rc == 0 and verify is not None and wanted:
            say("")
            say("verifying the changes this machine can try (each re-runs its scenario; a few "
                "minutes per change) ...")
            rc = verify(out_dir / ANALYSIS_FILE, out_dir / VERIFY_DIR, out_dir / REPORT_FILE,
                        wanted)
    say(f"render traces again with: otel-ttft tree {out_dir}")
    say(f"demo took {time.monotonic() - began:.0f} s")
    return rc
