"""The replay's prefix-cache state without vLLM (issue 49): warm requests send the shared prefix,
``--switch-ahead`` activates a switching step's model before its timed request and answers its
cold requests with probes that share nothing, ``--warm-prefix`` sends the shared prefix once
after each activation and before the timed request, and ``verify`` tries the prefix warm-up.

The chat endpoint is the small local SSE server of ``test_replay_client_metric``; the driver
records when it switches. tests/test_prefix_cache_vllm.py runs the same against real vLLM."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.tools.replay import drivers
from otel_ttft.tools.replay.client import make_tracer_provider
from otel_ttft.tools.replay.progress import Progress
from otel_ttft.tools.replay.prompts import SYSTEM_TEXT, build_prompts
from otel_ttft.tools.replay.runner import ReplayRun
from tests.test_replay_client_metric import _Chat


@pytest.fixture
def chat() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _Switching(drivers.Driver):
    """Serves one model at a time at the local chat URL; each switch is logged among the
    requests the server saw, and starts a new generation (a fresh server: empty caches)."""

    name = "restart"

    def __init__(self, targets: Sequence[drivers.Target], server: ThreadingHTTPServer):
        super().__init__(targets, Progress(live=False))
        self.server, self.current, self.starts = server, None, 0
        self.url_ = f"http://127.0.0.1:{server.server_address[1]}"

    def switch_to(self, target: drivers.Target, *, cold: bool = False,
                  prepare: Callable[[], object] | None = None) -> str:
        if self.current != target.name:
            self.current, self.starts = target.name, self.starts + 1
            self.server.seen.append({"switch": target.name})  # type: ignore[attr-defined]
        return self.url_

    def keep_resident(self, targets: Sequence[drivers.Target]) -> None:
        pass

    def url(self, target: drivers.Target) -> str:
        return self.switch_to(target)

    def generation(self, target: drivers.Target) -> object:
        return self.starts if self.current == target.name else None


def _replay(server: ThreadingHTTPServer, **options: bool) -> tuple[list, list]:
    """switch-back (B alone, then A), then short-prompt; what the server saw, and the spans."""
    prompts = build_prompts(lambda ms: sum(len(m["content"].split()) + 3 for m in ms), 200, 4)
    driver = _Switching([drivers.Target("a"), drivers.Target("b")], server)
    run = ReplayRun(driver, "a", "b", prompts, (semconv.SCENARIO_SWITCH_BACK,
                                                  semconv.SCENARIO_SHORT_PROMPT),
                    progress=Progress(live=False), repeat_warm=2, cold_requests=2, **options)
    spans = InMemorySpanExporter()
    provider = make_tracer_provider("http://127.0.0.1:1", exporter=spans)
    run.run(provider, 10)
    provider.shutdown()
    assert all(r.result.error is None for r in run.records)
    timed = [s for s in spans.get_finished_spans() if s.name == semconv.SPAN_REPLAY_REQUEST]
    return server.seen, timed  # type: ignore[attr-defined]


def _kind(seen: dict) -> str:
    if "switch" in seen:
        return f"switch {seen['switch']}"
    messages = seen["messages"]
    shared = messages[0]["role"] == "system" and messages[0]["content"] == SYSTEM_TEXT
    return f"{seen['model']} {'chat' if shared else 'probe' if len(messages) == 1 else '?'}"


def test_by_default_the_switch_is_inside_the_timed_request_and_warm_requests_share_the_prefix(
        chat):
    seen, timed = _replay(chat)
    # switch-back: B alone, then A's request makes the switch; short-prompt: A's cold requests
    # answered with the chat turn (its prefix cache warm), then the timed chat turns.
    assert [_kind(s) for s in seen] == [
        "switch b", "switch a", "a chat", "a chat", "a chat", "a chat", "a chat"]
    timed_questions = [s["messages"][-1]["content"] for s in seen if "messages" in s]
    assert len(set(timed_questions)) == len(timed_questions)  # a question of its own each
    back = next(s for s in timed if s.attributes[semconv.ATTR_REPLAY_SCENARIO] == "switch-back")
    assert back.attributes[semconv.ATTR_REPLAY_WARMUP_REQUESTS] == 0


def test_switch_ahead_activates_first_and_warms_the_process_not_the_prefix(chat):
    seen, timed = _replay(chat, switch_ahead=True)
    assert [_kind(s) for s in seen][:5] == [
        "switch b", "switch a", "a probe", "a probe", "a chat"]
    back = next(s for s in timed if s.attributes[semconv.ATTR_REPLAY_SCENARIO] == "switch-back")
    assert back.attributes[semconv.ATTR_REPLAY_WARMUP_REQUESTS] == 2
    assert back.attributes[semconv.ATTR_REPLAY_WARMUP_SERVED] == 2


def test_warm_prefix_sends_the_shared_prefix_once_after_each_activation_before_users(chat):
    seen, _ = _replay(chat, switch_ahead=True, warm_prefix=True)
    kinds = [_kind(s) for s in seen]
    # after A's activation: probes (its cold requests), one chat turn (the warm-up), then the
    # timed one; short-prompt's warm chat turns already hold the prefix: no second warm-up
    assert kinds == ["switch b", "switch a", "a probe", "a probe", "a chat", "a chat",
                     *["a chat", "a chat"] * 2]  # short-prompt x2: its warm request, its timed
    warm, user = seen[4], seen[5]
    assert warm["messages"][:-1] == user["messages"][:-1]  # the same shared prefix
    assert warm["messages"][-1] != user["messages"][-1]


def test_the_demo_says_what_it_measured_of_the_prefix_cache(tmp_path):
    """From spans through the analysis: the baseline read 384 of 400 prompt tokens from the
    cache, switch-back none; the demo's lines say so, with the prefill that cost."""
    import json

    from otel_ttft.tools.analysis.analyze import analyze
    from otel_ttft.tools.analysis.breakdown import collect
    from otel_ttft.tools.replay.demo import prefix_cache_lines
    from tests import analysis_fixtures as fx

    spans = [*fx.run_span()]
    spans += fx.warm_requests("short-prompt", "A", 0.0, n=5, tokens=400, cached=384,
                              prefill=0.020)
    spans += fx.warm_requests("switch-back", "A", 10.0, n=1, tokens=400, cached=0,
                              prefill=0.200)
    by_trace: dict[str, list[dict]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(analyze(collect(by_trace.values()))))
    lines = prefix_cache_lines(path)
    assert lines[0].startswith("prefix cache (vLLM's default: on)")
    assert "- short-prompt: 384 of 400" in lines
    (back,) = [ln for ln in lines if ln.startswith("- switch-back")]
    assert back.startswith("- switch-back: 0 of 400; 384 that its baseline read from the cache "
                           "were computed again: 192") and back.endswith(
                               "of prefill.uncached_prefix"), back
    # nothing measured: said so, not guessed
    path.write_text(json.dumps({"requests": []}))
    assert prefix_cache_lines(path) == [
        "prefix cache: no request reported the prompt tokens vLLM read from its cache"]
    assert prefix_cache_lines(tmp_path / "missing.json") == []
