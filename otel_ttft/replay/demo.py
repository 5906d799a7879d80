"""``otel-ttft demo``: the whole loop on one machine, for someone who has never used the tool.

Build the tiny model, start the embedded OTLP receiver, run a real vLLM server under
``opentelemetry-instrument`` pointed at it, send two chat completions, stop the server, and print
the activation tree. Whatever happens, the collected telemetry stays on disk and we say where.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TextIO

from otel_ttft.analysis.traces import build_trees, find_activation_roots, find_request_spans
from otel_ttft.analysis.tree import format_duration, render_tree
from otel_ttft.replay.server import ServerStartError, VllmServer
from otel_ttft.sink.receiver import OTLPReceiver
from otel_ttft.sink.store import STORE_FILES, SpanStore

DEFAULT_OUT = Path("out/demo")
LOG_FILE = "vllm-server.log"
PROMPTS = ("Say hello in five words.", "Name three colors.")
REQUEST_TIMEOUT_S = 60
# Signal-specific variables from the user's shell would override ours and send data elsewhere.
_UNSET = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")


@dataclass
class RequestResult:
    prompt: str
    ttft_s: float | None = None
    total_s: float | None = None
    text: str = ""
    error: str | None = None


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


def chat(base_url: str, model: str, prompt: str, max_tokens: int = 16) -> RequestResult:
    """One streamed chat completion; client-observed TTFT is the first content chunk."""
    result = RequestResult(prompt)
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "stream": True, "temperature": 0,
    }).encode()
    req = urllib.request.Request(f"{base_url}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[5:]).get("choices") or [{}]
                delta = choices[0].get("delta", {}).get("content")
                if delta:
                    if result.ttft_s is None:
                        result.ttft_s = time.monotonic() - start
                    result.text += delta
    except (OSError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.total_s = time.monotonic() - start
    return result


def _served_model(base_url: str, fallback: str) -> str:
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as resp:
            return json.load(resp)["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return fallback


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


def _clear(out: Path, out_stream: TextIO) -> None:
    old = [out / n for n in (*STORE_FILES, LOG_FILE) if (out / n).exists()]
    if old:
        print(f"replacing the previous demo data in {out}", file=out_stream)
        for path in old:
            path.unlink()


def print_trees(spans: list[dict], out: TextIO) -> int:
    """Activation trees if any; else every multi-span tree and a count of lone spans."""
    activations = find_activation_roots(spans)
    if activations:
        for root in activations + find_request_spans(spans):
            print(render_tree(root), file=out, end="\n\n")
        return len(activations)
    print("no 'vllm.activation' span arrived (is the otel-ttft instrumentation active?);"
          " showing the trees that did:", file=out)
    roots = [r for rs in build_trees(spans).values() for r in rs]
    lone = Counter(r.name for r in roots if not r.children)
    for root in sorted((r for r in roots if r.children), key=lambda r: r.start_ns):
        print(render_tree(root), file=out, end="\n\n")
    if lone:
        print("single spans: " + ", ".join(f"{n} x{c}" for n, c in lone.most_common()), file=out)
    return 0


def run_demo(out_dir: str | Path = DEFAULT_OUT, *, keep_going: bool = False,
             stream: TextIO | None = None, start_timeout_s: float = 300) -> int:
    """The demo; returns the process exit code. ``keep_going``: a failed request does not end
    the demo early nor fail it, as long as the server came up and telemetry arrived."""
    out = stream or sys.stdout
    say = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear(out_dir, out)
    if not _installed():
        say("warning: otel-ttft is not installed in this environment (`pip install -e .`), "
            "so opentelemetry-instrument cannot load it; expect vLLM's own spans only")

    from otel_ttft.tiny_model import ensure_tiny_model  # heavy imports; only the demo needs them

    say("building the tiny model (cached after the first run) ...")
    try:
        model_dir = ensure_tiny_model()
    except Exception as exc:  # missing transformers/tokenizers, unwritable cache, ...
        say(f"error: could not build the tiny model: {type(exc).__name__}: {exc}")
        return 1
    store = SpanStore(out_dir)
    start_error: str | None = None
    with OTLPReceiver(store, grpc_port=None) as receiver:
        say(f"OTLP receiver on {receiver.http_endpoint}, storing into {out_dir}")
        server = VllmServer(model_dir, instrument=True, log_path=out_dir / LOG_FILE,
                            env=telemetry_env(receiver.http_endpoint))
        say(f"starting vLLM on {server.url} (about a minute on a CPU; log: {server.log_path})")
        started = time.monotonic()
        try:
            server.start(timeout_s=start_timeout_s)
        except ServerStartError as exc:
            say(f"error: {exc}")
            start_error = "the vLLM server did not become healthy (see the log lines above)"
        except KeyboardInterrupt:
            start_error = "interrupted while the server was starting"
        failed = start_error is not None
        if not failed:
            say(f"server healthy after {time.monotonic() - started:.1f} s")
            try:
                failed = not _send_requests(server.url, str(model_dir), keep_going, say)
            finally:
                say("stopping the server (its processes flush telemetry as they exit) ...")
                server.stop()
        spans = _wait_quiet(store)
    say("")
    if spans:
        print_trees(spans, out)
    points = len(store.metric_points())
    say(f"data: {store.spans_path} ({len(spans)} spans), {store.metrics_path} ({points} metric "
        f"points), server log {out_dir / LOG_FILE}")
    say(f"render again with: otel-ttft tree {out_dir}")
    if start_error:
        say(f"error: {start_error}; what was collected is kept in {out_dir}")
        return 1
    if not spans:
        say("error: no spans arrived; see the server log for exporter errors")
        return 1
    if failed:
        say("error: a request failed (see above); --keep-going sends the rest anyway")
        return 1
    return 0


def _send_requests(url: str, model_dir: str, keep_going: bool, say) -> bool:
    model = _served_model(url, model_dir)
    ok = True
    for i, prompt in enumerate(PROMPTS, 1):
        r = chat(url, model, prompt)
        if r.error:
            say(f"request {i}: failed after {format_duration(r.total_s or 0)}: {r.error}")
            ok = False
            if not keep_going:
                return False
            continue
        ttft = format_duration(r.ttft_s) if r.ttft_s is not None else "no tokens"
        say(f"request {i}: client TTFT {ttft}, total {format_duration(r.total_s or 0)}")
    return ok or keep_going
