"""Run the scenarios: put the state in place (untimed), then the timed requests, all traced.

Each scenario is a setup (which model is up, warm requests, page cache evicted) and its timed
steps. A timed step's ``replay.request`` starts when the request is made; the driver's switch, if
any, happens inside it, as the user lives it.

The state is checked, not assumed. Warm means warm: before a scenario's timed requests every
model it uses has answered the requests its activation counts as cold (``OTEL_TTFT_COLD_REQUESTS``,
3), counted per server since it last (re)started, so no timed request of a warm scenario is the
first one a fresh server sees. Cold means cold: a cold step's checkpoint is evicted, measured
right before its server starts, evicted once more when still resident (``evict``); the replay
span records both, and the verdict calls a step that stayed resident "not cold". Each repeat of
a switching scenario costs a server start (``repeat``); the others cost requests to a running
server and run ``repeat_warm`` times, so the baseline's noise is measured.

The prefix cache is part of the state (vLLM's default: on). Warm requests send the chat turn, so a
warm server holds its shared prefix. Each request gets a number of its own (``PromptSet``): chat
turns share only their prefix, long prompts nothing. ``switch_ahead``: a switching step's model is
activated before its timed requests arrive (a router that activates ahead of its users), its
activation's cold requests answered with a probe that shares no prefix; the timed requests then
measure what the activation left cold besides the process: the prefix cache. ``warm_prefix``
(``otel-ttft verify``'s ``prefix-warm-up``): after each activation, one untimed chat turn with the
shared prefix before the timed requests arrive, the switch made first where it was part of one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.runtime import environment_variables as env
from otel_ttft.tools.replay import evict
from otel_ttft.tools.replay.client import CLIENT_NAME, ChatClient, RequestResult, Sampling
from otel_ttft.tools.replay.drivers import Driver, Target
from otel_ttft.tools.replay.progress import Progress
from otel_ttft.tools.replay.prompts import PromptSet
from otel_ttft.tools.replay.server import ServerStartError

FLUSH_MS = 10_000


@dataclass(frozen=True)
class Step:
    model: str
    prompt: str = "short"
    cold: bool = False  # restart with empty compile cache
    resident: bool = False  # no switch: served next to the others


@dataclass(frozen=True)
class Plan:
    exclusive: str | None  # the model that must be served alone before the steps
    resident: tuple[str, ...] = ()  # models that must all be up (resident-dual)
    warm: tuple[str, ...] = ()  # untimed requests first
    evict: tuple[str, ...] = ()  # models whose checkpoint leaves the page cache
    steps: tuple[Step, ...] = ()


def plan(scenario: str, a: str, b: str, adapters: Sequence[str]) -> Plan:
    """What each scenario of the article means, for models ``a`` and ``b``."""
    if scenario == "cold-switch":
        return Plan(a, warm=(a,), evict=(b,), steps=(Step(b, cold=True),))
    if scenario == "switch-back":  # right after B: A's page cache and compile cache survived
        return Plan(b, steps=(Step(a),))
    if scenario == "resident-dual":
        return Plan(None, resident=(a, b), warm=(a, b),
                    steps=(Step(a, resident=True), Step(b, resident=True)))
    if scenario == "short-prompt":
        return Plan(a, warm=(a,), steps=(Step(a),))
    if scenario == "long-prompt":
        return Plan(a, warm=(a,), steps=(Step(a, "long"),))
    if scenario == "adapter-switch":
        if len(adapters) < 2:
            raise ValueError("adapter-switch needs two adapters")
        first, second = adapters[0], adapters[1]
        return Plan(a, warm=(first,), steps=(Step(second), Step(first)))
    raise ValueError(f"unknown scenario {scenario!r}")


@dataclass
class Record:
    scenario: str
    repeat_index: int
    step: Step
    result: RequestResult


@dataclass
class ReplayRun:
    driver: Driver
    model_a: str
    model_b: str
    prompts: PromptSet
    scenarios: Sequence[str] = semconv.SCENARIOS
    adapters: Sequence[str] = ()
    repeat: int = 1  # runs of each switching scenario (a server start each)
    concurrency: int = 1
    sampling: Sampling = field(default_factory=Sampling)
    checkpoints: dict[str, Path] = field(default_factory=dict)  # for page-cache eviction
    progress: Progress = field(default_factory=Progress)
    setup: dict | None = None  # how to run it again (replay.setup.record); for verify
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    records: list[Record] = field(default_factory=list)
    repeat_warm: int | None = None  # runs of every other scenario; None: ``repeat``
    cold_requests: int = env.DEFAULT_COLD_REQUESTS  # the servers' OTEL_TTFT_COLD_REQUESTS
    switch_ahead: bool = False  # activate before the timed requests (probes, not the prefix)
    warm_prefix: bool = False  # after each activation, the shared prefix once, untimed
    history: str | None = None  # the servers' activation history: each switch's forecast
    _last_model: str | None = None
    # target name -> (driver generation, requests its server answered since then)
    _served: dict[str, tuple[object, int]] = field(default_factory=dict)
    _warmed: dict[str, int] = field(default_factory=dict)  # this repeat: untimed per target
    _prefix_warmed: dict[str, object] = field(default_factory=dict)  # target -> generation
    _sent: int = 0  # requests made: each one's number in its prompt

    def _messages(self, kind: str) -> list[dict[str, str]]:
        """The next request's messages (``probe`` or a step's prompt kind); numbered from a
        point of this run's own, so no run repeats another's prompts to the same servers."""
        self._sent += 1
        prompt = self.prompts.probe if kind == "probe" else self.prompts.get(kind)
        return prompt.messages(int(self.run_id[:6], 16) + self._sent)

    def repeats(self, scenario: str) -> int:
        """How often ``scenario`` runs: switching ones cost a server start each, except between
        resident servers. There a switch costs nothing, and measured once its request would be
        the first the idle server sees (vLLM's engine stops spinning on its queue a second after
        its last read): a few ms slower than the baseline's back-to-back requests, enough to
        read as an expansion."""
        if self.repeat_warm is None:
            return self.repeat
        if scenario in semconv.SCENARIOS_SWITCHING:
            if self.driver.name == "resident":
                return max(self.repeat, self.repeat_warm)
            return self.repeat
        return self.repeat_warm

    def attributes(self) -> dict:
        setup = {} if self.setup is None else {
            semconv.ATTR_REPLAY_SETUP: json.dumps(self.setup, sort_keys=True)}
        return {**setup,
            semconv.ATTR_REPLAY_RUN_ID: self.run_id,
            semconv.ATTR_REPLAY_DRIVER: self.driver.name,
            semconv.ATTR_REPLAY_MODELS: [self.model_a, self.model_b, *self.adapters],
            semconv.ATTR_REPLAY_CLIENT: CLIENT_NAME,
            semconv.ATTR_REPLAY_SAMPLING: self.sampling.record(),
            semconv.ATTR_REPLAY_CONCURRENCY: self.concurrency,
            semconv.ATTR_REPLAY_PROMPTS: self.prompts.record(),
            semconv.ATTR_REPLAY_REPEAT: self.repeat,
            semconv.ATTR_REPLAY_REPEAT_WARM: (self.repeat if self.repeat_warm is None
                                              else self.repeat_warm),
            semconv.ATTR_REPLAY_COLD_REQUESTS: self.cold_requests,
            semconv.ATTR_REPLAY_SCENARIOS: list(self.scenarios),
        }

    def run(self, provider: TracerProvider, timeout_s: float = 300.0,
            meter_provider: MeterProvider | None = None) -> list[Record]:
        """Every scenario, ``repeats(scenario)`` times; the run span ends (and spans and the
        client TTFT metric are flushed, each within FLUSH_MS) whatever happens. A server that
        never becomes healthy ends the run (ServerStartError propagates)."""
        tracer = provider.get_tracer("otel_ttft.tools.replay")
        span = tracer.start_span(semconv.SPAN_REPLAY_RUN, context=otel_context.Context(),
                                 start_time=clock.now_ns(), attributes=self.attributes())
        client = ChatClient(tracer, self.sampling, timeout_s, meter_provider)
        try:
            for scenario in self.scenarios:
                for index in range(self.repeats(scenario)):
                    self._scenario(client, scenario, index)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:300]))
            raise
        finally:
            client.close()
            span.end(end_time=clock.now_ns())
            provider.force_flush(FLUSH_MS)
            if meter_provider is not None:
                meter_provider.force_flush(FLUSH_MS)
        return self.records

    def _target(self, model: str) -> Target:
        return self.driver.target_for(model)

    def _scenario(self, client: ChatClient, scenario: str, index: int) -> None:
        p = plan(scenario, self.model_a, self.model_b, self.adapters)
        self.progress.line(f"{scenario} #{index + 1}/{self.repeats(scenario)}")
        self._warmed = {}
        if p.exclusive is not None:
            self.driver.switch_to(self._target(p.exclusive))
            self._last_model = p.exclusive  # a repeat of switch-back switches again
        if p.resident:
            self.driver.keep_resident([self._target(m) for m in p.resident])
        # The first timed step's model is warmed last: right after another server's request,
        # that server's engine is still busy-polling (vLLM's shm readers spin for 1 s after a
        # read), which on few cores takes CPU from the timed request; the setup must not.
        first = p.steps[0].model if p.steps else None
        for model in sorted(p.warm, key=lambda m: m == first):
            self._warm(client, model)
            self._last_model = model
        for model in p.evict:
            path = self.checkpoints.get(model)
            if path is not None:
                evict.evict(path)
        for step in p.steps:
            self._timed(client, scenario, index, step, evicted=step.model in p.evict)

    def _served_since_start(self, target: Target) -> int:
        """Requests ``target``'s current server answered (as far as this run knows)."""
        generation, count = self._served.get(target.name, (None, 0))
        return count if generation == self.driver.generation(target) else 0

    def _note_served(self, target: Target, count: int) -> None:
        self._served[target.name] = (self.driver.generation(target),
                                     self._served_since_start(target) + count)

    def _warm(self, client: ChatClient, model: str, kind: str = "short", *,
              least: int = 1) -> None:
        """Untimed requests until ``model``'s server has answered the ones its activation
        counts as cold, at least ``least`` (one: the scenario's state is "served and warm").
        ``kind`` ``short`` warms the prefix cache too, ``probe`` the process only."""
        target = self._target(model)
        url = self.driver.url(target)  # first: behind a router, asking for it may swap it in
        need = max(least, self.cold_requests - self._served_since_start(target))
        for _ in range(need):
            client.warm(url, model, self._messages(kind), probe=kind == "probe")
        self._note_served(target, need)
        self._warmed[target.name] = self._warmed.get(target.name, 0) + need
        if kind == "short":
            self._prefix_warmed[target.name] = self.driver.generation(target)

    def _ahead(self, client: ChatClient, step: Step, prepare) -> None:
        """``switch_ahead`` / ``warm_prefix``: the step's model activated before its timed
        requests, then (ahead) its cold requests answered by probes and (warm-prefix) the
        shared prefix sent once since this activation."""
        target = self._target(step.model)
        self.driver.switch_to(target, cold=step.cold, prepare=prepare)
        if self.switch_ahead:
            self._warm(client, step.model, "probe", least=0)
        if self.warm_prefix and self._prefix_warmed.get(target.name) != \
                self.driver.generation(target):
            self._warm(client, step.model, "short", least=1)

    def _forecast(self, step: Step, switch_from: str | None) -> str:
        """The forecast of ``step``'s first token, read just before its switch (the page cache
        as the setup left it; a cold step's compile cache is the empty one it will get)."""
        from otel_ttft.tools.forecast import forecast_for

        try:
            doc = forecast_for(step.model, outgoing=switch_from, path=self.history,
                               empty_compile_cache=step.cold)
        except Exception as exc:  # noqa: BLE001 - a forecast never costs the replay its run
            doc = {"model": step.model, "status": "error", "basis": [f"{type(exc).__name__}"]}
        return json.dumps(doc, sort_keys=True, allow_nan=False)

    def _timed(self, client: ChatClient, scenario: str, index: int, step: Step, *,
               evicted: bool = False) -> None:
        target = self._target(step.model)
        switch_from = self._last_model if self._last_model != step.model else None
        path = self.checkpoints.get(step.model)
        check = evict.ColdCheck(attempts=1) if evicted and path is not None else None

        def prepare() -> None:  # right before the server starts: cold means cold
            if check is not None and path is not None:
                evict.make_cold(path, check)

        ahead = (self.switch_ahead or self.warm_prefix) and not step.resident
        if ahead:
            self._ahead(client, step, prepare)

        def before_send() -> str:
            if step.resident:
                return self.driver.url(target)
            return self.driver.switch_to(target, cold=step.cold, prepare=prepare)

        def after_switch() -> dict:
            attrs = {semconv.ATTR_REPLAY_WARMUP_REQUESTS: self._warmed.get(target.name, 0),
                     semconv.ATTR_REPLAY_WARMUP_SERVED: self._served_since_start(target)}
            if check is not None:
                attrs.update(check.attributes())
            return attrs

        attrs = {semconv.ATTR_REPLAY_RUN_ID: self.run_id,
                 semconv.ATTR_REPLAY_SCENARIO: scenario,
                 semconv.ATTR_REPLAY_REPEAT_INDEX: index,
                 semconv.ATTR_REPLAY_PROMPT: step.prompt,
                 semconv.ATTR_REPLAY_SWITCH_FROM: switch_from}
        # Cold: the request waited for a switch (another model or adapter made way for it) or a
        # cold start; resident steps, every step of the resident driver, and steps whose switch
        # was made ahead of them never wait.
        cold = (self.driver.name != "resident" and not step.resident and not ahead
                and (step.cold or switch_from is not None))
        metric_attrs = {semconv.ATTR_REPLAY_SCENARIO: scenario, semconv.ATTR_REQUEST_COLD: cold}
        if cold and scenario in semconv.SCENARIOS_SWITCHING and self.history:
            attrs[semconv.ATTR_REPLAY_FORECAST] = self._forecast(step, switch_from)
        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = [pool.submit(client.request, step.model, self._messages(step.prompt),
                                   before_send, attrs, metric_attributes=metric_attrs,
                                   after_switch=after_switch)
                       for _ in range(self.concurrency)]
            results = [f.result() for f in futures]
        self._last_model = step.model
        self._note_served(target, sum(1 for r in results if r.ttft_s is not None))
        if check is not None and check.cold is False:
            self.progress.line(f"  not cold: {step.model}'s checkpoint stayed "
                               f"{check.resident:.0%} in the page cache"
                               + (f" (mapped by {', '.join(check.held_by)})"
                                  if check.held_by else ""))
        for result in results:
            self.records.append(Record(scenario, index, step, result))
            ttft = f"{result.ttft_s:.3f} s" if result.ttft_s is not None else "-"
            self.progress.line(f"  {step.model} [{step.prompt}] client TTFT {ttft}"
                               + (f"  error: {result.error}" if result.error else ""))
        start_errors = [r.error for r in results if r.error and "ServerStartError" in r.error]
        if start_errors:
            raise ServerStartError(start_errors[0])
