"""Replay pieces that run without vLLM: prompt sizing and recording, scenario plans, command
templates, the sleep driver against real local HTTP endpoints (sleep mode needs a GPU), server
starts that fail, the client's failure path, and hostile command lines (exit 2, one line)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ttft import semconv
from otel_ttft.tools import cli
from otel_ttft.tools.replay import drivers
from otel_ttft.tools.replay.client import ChatClient, Sampling, make_tracer_provider
from otel_ttft.tools.replay.progress import Progress
from otel_ttft.tools.replay.prompts import (
    SHORT_TEXT,
    PromptError,
    build_prompts,
    tokenizer_counter,
)
from otel_ttft.tools.replay.runner import ReplayRun, plan
from otel_ttft.tools.replay.server import ServerStartError, free_port


def words(messages: list[dict]) -> int:
    """A stand-in tokenizer: a token a word, three for each message's template."""
    return sum(len(m["content"].split()) + 3 for m in messages)


def test_prompts_share_a_long_prefix_or_nothing_and_only_hashes_are_recorded():
    prompts = build_prompts(words, max_model_len=200, max_tokens=16)
    budget = 200 - 16 - 8
    assert prompts.long.tokens == budget  # the largest that fits
    assert prompts.short.tokens <= int(0.6 * budget) < prompts.long.tokens
    # The chat turn: the same system prompt and history, a question of its own per request.
    one, two = prompts.short.messages(1), prompts.short.messages(2)
    assert one[:-1] == two[:-1] and one[-1] != two[-1] and one[0]["role"] == "system"
    assert [m["role"] for m in one[-2:]] == ["assistant", "user"]
    assert prompts.short.shared_tokens == words(one[:-1]) > 0.8 * prompts.short.tokens
    # The long prompt: one message whose first words differ per request.
    first, second = prompts.long.messages(1), prompts.long.messages(2)
    assert len(first) == 1 and first[0]["content"].split()[0] != second[0]["content"].split()[0]
    assert words(first) == words(second) == budget and prompts.long.shared_tokens == 0
    assert prompts.probe.messages(7) == [{"role": "user", "content": SHORT_TEXT}]
    record = json.loads(prompts.record())
    assert set(record) == {"short", "long"}
    assert record["long"] == {"tokens": budget, "shared_prefix_tokens": 0,
                              "sha256": prompts.long.sha256}
    assert record["short"]["shared_prefix_tokens"] == prompts.short.shared_tokens
    text = prompts.record()
    assert all(m["content"] not in text for m in one + first)
    assert build_prompts(words, 200, 16) == prompts  # fixed: the same every run


def test_prompts_sized_with_the_models_own_tokenizer(tiny_model):
    count = tokenizer_counter(str(tiny_model))
    prompts = build_prompts(count, max_model_len=512, max_tokens=16)
    assert 512 - 16 - 8 - 4 <= prompts.long.tokens <= 512 - 16 - 8
    # whatever the request's number, it fits the context
    assert max(count(prompts.long.messages(n)) for n in range(0, 10 ** 8, 7_654_321)) <= 488
    assert prompts.short.shared_tokens >= 256  # two of vLLM-CPU's 128-token blocks


def test_prompts_refuse_a_context_too_small_and_a_missing_tokenizer(tmp_path):
    with pytest.raises(PromptError, match="no room"):
        build_prompts(words, max_model_len=20, max_tokens=16)
    with pytest.raises(PromptError, match="cannot load a tokenizer"):
        tokenizer_counter(str(tmp_path))


def test_scenario_plans_follow_the_article():
    cold = plan("cold-switch", "A", "B", ())
    assert cold.exclusive == "A" and cold.warm == ("A",) and cold.evict == ("B",)
    assert [(s.model, s.cold) for s in cold.steps] == [("B", True)]
    back = plan("switch-back", "A", "B", ())
    assert back.exclusive == "B" and [s.model for s in back.steps] == ["A"] and not back.warm
    dual = plan("resident-dual", "A", "B", ())
    assert dual.resident == ("A", "B") and all(s.resident for s in dual.steps)
    assert [s.prompt for s in plan("long-prompt", "A", "B", ()).steps] == ["long"]
    adapters = plan("adapter-switch", "A", "B", ("x", "y"))
    assert adapters.warm == ("x",) and [s.model for s in adapters.steps] == ["y", "x"]
    with pytest.raises(ValueError):
        plan("adapter-switch", "A", "B", ("x",))
    with pytest.raises(ValueError):
        plan("nope", "A", "B", ())


def test_switching_scenarios_repeat_as_paid_for_and_the_others_as_warm_repeats(tiny_model):
    prompts = build_prompts(tokenizer_counter(str(tiny_model)), 512, 16)
    driver = drivers.ResidentDriver([_target("A", url="http://127.0.0.1:1"),
                                     _target("B", url="http://127.0.0.1:2")],
                                    Progress(live=False))
    proxy = drivers.ProxyDriver([_target("A"), _target("B")], Progress(live=False),
                                proxy_url="http://127.0.0.1:3")
    run = ReplayRun(proxy, "A", "B", prompts, repeat=2, repeat_warm=5)
    assert {s: run.repeats(s) for s in semconv.SCENARIOS} == {
        "cold-switch": 2, "switch-back": 2, "resident-dual": 5, "short-prompt": 5,
        "long-prompt": 5, "adapter-switch": 5}
    # Between resident servers a switch costs nothing: measured once, it would be the first
    # request its idle server sees, slower than the baseline's back-to-back ones.
    run = ReplayRun(driver, "A", "B", prompts, repeat=2, repeat_warm=5)
    assert {s: run.repeats(s) for s in semconv.SCENARIOS_SWITCHING} == {
        "cold-switch": 5, "switch-back": 5}
    assert ReplayRun(driver, "A", "B", prompts, repeat=7, repeat_warm=5).repeats(
        "switch-back") == 7
    attrs = run.attributes()
    assert (attrs[semconv.ATTR_REPLAY_REPEAT], attrs[semconv.ATTR_REPLAY_REPEAT_WARM],
            attrs[semconv.ATTR_REPLAY_COLD_REQUESTS]) == (2, 5, 3)
    assert ReplayRun(driver, "A", "B", prompts, repeat=3).repeats("short-prompt") == 3


def test_generations_change_when_a_server_may_have_been_reactivated():
    """What "warm" is counted against: requests served before a (re)start do not count."""
    targets = [_target("A", url="http://127.0.0.1:1"), _target("B", url="http://127.0.0.1:2")]
    resident = drivers.ResidentDriver(targets, Progress(live=False))
    assert resident.generation(targets[0]) == resident.generation(targets[0])
    proxy = drivers.ProxyDriver(targets, Progress(live=False), proxy_url="http://127.0.0.1:9")
    prepared = []
    before = proxy.generation(targets[0])
    proxy.switch_to(targets[0], prepare=lambda: prepared.append("A"))
    after = proxy.generation(targets[0])
    proxy.url(targets[0])  # asking again for the model it serves: no swap
    assert before != after == proxy.generation(targets[0]) and prepared == ["A"]
    proxy.url(targets[1])  # the router swaps B in, then A again
    proxy.switch_to(targets[0], prepare=lambda: prepared.append("A again"))
    assert proxy.generation(targets[0]) != after and prepared == ["A", "A again"]


def test_templates_expand_and_reject_what_would_break_a_restart():
    argv = drivers.expand("python -m x --model '{model}' --port {port}", model="a b", port=5)
    assert argv == ["python", "-m", "x", "--model", "a b", "--port", "5"]
    drivers.check_template(drivers.DEFAULT_TEMPLATE)
    for bad, message in (("python --model {model}", "no {port}"),
                         ("x {port} {nope}", "unknown placeholder"),
                         ("x {port} {0}", "bad placeholder"),
                         ("'unclosed {port}", "does not parse"),
                         ("   ", "no {port}")):
        with pytest.raises(drivers.TemplateError, match=message):
            drivers.check_template(bad)


def _target(name, **kw):
    return drivers.Target(name, **kw)


def test_restart_driver_reports_a_server_that_cannot_start(tmp_path):
    progress = Progress(live=False)
    gone = drivers.RestartDriver([_target("a", template="/nonexistent/vllm {port}")], progress,
                                 log_dir=tmp_path, env={}, start_timeout_s=5)
    with pytest.raises(ServerStartError, match="cannot run"):
        gone.switch_to(gone.targets[0])
    exits = drivers.RestartDriver(
        [_target("a", template=f"{sys.executable} -c 'import sys; print(\"bye\"); sys.exit(3)'"
                                " {port}")],
        progress, log_dir=tmp_path, env={}, start_timeout_s=30)
    with pytest.raises(ServerStartError, match=r"exited with code 3.*log: .*vllm-a-1\.log"):
        exits.switch_to(exits.targets[0])
    assert not exits.servers
    hangs = drivers.RestartDriver(
        [_target("a", template=f"{sys.executable} -c 'import time; time.sleep(60)' {{port}}")],
        progress, log_dir=tmp_path, env={}, start_timeout_s=1)
    with pytest.raises(ServerStartError, match="not healthy after 1 s"):
        hangs.switch_to(hangs.targets[0])
    assert not hangs.servers


class _SleepEndpoints(BaseHTTPRequestHandler):
    """vLLM's dev endpoints as the sleep driver calls them (they need a GPU to run for real)."""

    def do_POST(self):  # noqa: N802
        self.server.calls.append(self.path)
        status = 500 if self.server.fail else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoints():
    servers = []

    def make(fail=False):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _SleepEndpoints)
        server.calls, server.fail = [], fail
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def test_sleep_driver_sleeps_the_outgoing_model_and_wakes_the_next(endpoints):
    a, b = endpoints(), endpoints()
    url = lambda s: f"http://127.0.0.1:{s.server_address[1]}"  # noqa: E731
    driver = drivers.SleepDriver([_target("A", url=url(a)), _target("B", url=url(b))],
                                 Progress(live=False))
    assert driver.switch_to(driver.target_for("A")) == url(a)
    assert (a.calls, b.calls) == ([], ["/sleep?level=1"])
    assert driver.switch_to(driver.target_for("A")) == url(a)  # already served: nothing to do
    assert driver.switch_to(driver.target_for("B")) == url(b)
    assert (a.calls, b.calls) == (["/sleep?level=1"], ["/sleep?level=1", "/wake_up"])
    driver.keep_resident(driver.targets)
    assert a.calls[-1] == "/wake_up" and not driver.asleep
    driver.close()


def test_sleep_driver_fails_loudly_when_the_endpoint_does(endpoints):
    a, b = endpoints(), endpoints(fail=True)
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in (a, b)]
    driver = drivers.SleepDriver([_target("A", url=urls[0]), _target("B", url=urls[1])],
                                 Progress(live=False))
    with pytest.raises(drivers.DriverError, match="HTTP 500"):
        driver.switch_to(driver.target_for("A"))


def test_resident_and_proxy_drivers_never_switch():
    targets = [_target("A", url="http://127.0.0.1:1", adapters=("x",)),
               _target("B", url="http://127.0.0.1:2")]
    resident = drivers.ResidentDriver(targets, Progress(live=False))
    assert resident.switch_to(resident.target_for("x")) == "http://127.0.0.1:1"
    assert resident.url(resident.target_for("B")) == "http://127.0.0.1:2"
    proxy = drivers.ProxyDriver(targets, Progress(live=False), proxy_url="http://127.0.0.1:9/")
    assert {proxy.switch_to(t) for t in targets} == {"http://127.0.0.1:9"}
    with pytest.raises(drivers.DriverError):
        proxy.target_for("C")


def test_a_failed_request_is_a_finished_error_span_with_the_run_attributes():
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider("http://127.0.0.1:1", exporter=exporter)
    client = ChatClient(provider.get_tracer("t"), Sampling(), timeout_s=5)
    port = free_port()  # nothing listens there
    result = client.request("m", [{"role": "user", "content": "secret text"}],
                            lambda: f"http://127.0.0.1:{port}",
                            {semconv.ATTR_REPLAY_SCENARIO: "short-prompt"})
    client.close()
    provider.shutdown()
    assert result.error and "ConnectError" in result.error and result.ttft_s is None
    span = next(s for s in exporter.get_finished_spans()
                if s.name == semconv.SPAN_REPLAY_REQUEST)
    assert span.parent is None and span.kind.name == "CLIENT"
    assert span.status.status_code.name == "ERROR"
    assert span.attributes[semconv.ATTR_REPLAY_ERROR] == result.error
    assert span.attributes[semconv.GEN_AI_REQUEST_MODEL] == "m"
    assert span.resource.attributes["service.name"] == semconv.REPLAY_SERVICE_NAME
    assert all("secret" not in str(v) for v in span.attributes.values())


@pytest.mark.parametrize("argv, message", [
    (["--scenarios", "cold-switch,bogus"], "unknown scenario 'bogus'"),
    (["--scenarios", ","], "unknown scenario"),
    (["--repeat", "0"], "--repeat: must be >= 1"),
    (["--repeat", "1e9x"], "--repeat: must be an integer"),
    (["--repeat-warm", "0"], "--repeat-warm: must be >= 1"),
    (["--repeat-warm", "many"], "--repeat-warm: must be an integer"),
    (["--repeat-warm", "100000"], "load test"),
    (["--concurrency", "100000"], "load test"),
    (["--driver", "nope"], "unknown driver"),
    (["--serve-a", "python -m vllm --model {model}"], "no {port}"),
    (["--adapter", "just-a-name"], "NAME=PATH"),
    (["--otlp-endpoint", "ftp://127.0.0.1"], "not an http(s) URL"),
    (["--otlp-endpoint", "http://127.0.0.1:99999"], "not a valid URL"),
    (["--otlp-endpoint", "http://[::1"], "not a valid URL"),
    (["--otlp-endpoint", f"http://127.0.0.1:{free_port()}"], "cannot reach"),
    (["--start-timeout", "-1"], "must be > 0"),
])
def test_hostile_command_lines_exit_2_with_one_line(argv, message, capsys):
    assert cli.main(["replay", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("otel-ttft replay: ")
    if message:
        assert message in err


def test_unreachable_servers_exit_2_before_anything_starts(receiver, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    common = ["--otlp-endpoint", receiver.http_endpoint, "--name-a", "a", "--name-b", "b"]
    assert cli.main(["replay", "--driver", "proxy", "--proxy-url", dead, *common]) == 2
    assert "--proxy-url: cannot reach" in capsys.readouterr().err
    assert cli.main(["replay", "--driver", "resident", "--url-a", dead, "--url-b", dead,
                     *common]) == 2
    assert "--url-a: cannot reach" in capsys.readouterr().err
    assert cli.main(["replay", "--driver", "resident", "--url-a", receiver.http_endpoint,
                     "--url-b", receiver.http_endpoint, "--otlp-endpoint",
                     receiver.http_endpoint]) == 2
    assert "needs --name-a and --name-b" in capsys.readouterr().err
    assert receiver.store.spans() == []  # nothing ran


def test_semconv_replay_names_are_documented():
    text = (Path(__file__).resolve().parents[1] / "docs" / "replay.md").read_text()
    for name in (semconv.SPAN_REPLAY_RUN, semconv.SPAN_REPLAY_REQUEST, semconv.SPAN_SWITCH,
                 semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, *semconv.SCENARIOS, *semconv.DRIVERS):
        assert f"`{name}`" in text, name
