"""Run the scenarios: put the state in place (untimed), then the timed requests, all traced.

Each scenario is a setup (which model is up, warm requests, page cache evicted) and its timed
steps. A timed step's ``replay.request`` starts when the request is made; the driver's switch, if
any, happens inside it, as the user lives it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from otel_ttft import clock, pagecache, semconv
from otel_ttft.replay.client import CLIENT_NAME, ChatClient, RequestResult, Sampling
from otel_ttft.replay.drivers import Driver, Target
from otel_ttft.replay.progress import Progress
from otel_ttft.replay.prompts import PromptSet
from otel_ttft.replay.server import ServerStartError

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
    repeat: int = 1
    concurrency: int = 1
    sampling: Sampling = field(default_factory=Sampling)
    checkpoints: dict[str, Path] = field(default_factory=dict)  # for page-cache eviction
    progress: Progress = field(default_factory=Progress)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    records: list[Record] = field(default_factory=list)
    _last_model: str | None = None

    def attributes(self) -> dict:
        return {
            semconv.ATTR_REPLAY_RUN_ID: self.run_id,
            semconv.ATTR_REPLAY_DRIVER: self.driver.name,
            semconv.ATTR_REPLAY_MODELS: [self.model_a, self.model_b, *self.adapters],
            semconv.ATTR_REPLAY_CLIENT: CLIENT_NAME,
            semconv.ATTR_REPLAY_SAMPLING: self.sampling.record(),
            semconv.ATTR_REPLAY_CONCURRENCY: self.concurrency,
            semconv.ATTR_REPLAY_PROMPTS: self.prompts.record(),
            semconv.ATTR_REPLAY_REPEAT: self.repeat,
            semconv.ATTR_REPLAY_SCENARIOS: list(self.scenarios),
        }

    def run(self, provider: TracerProvider, timeout_s: float = 300.0,
            meter_provider: MeterProvider | None = None) -> list[Record]:
        """Every scenario, ``repeat`` times; the run span ends (and spans and the client TTFT
        metric are flushed, each within FLUSH_MS) whatever happens. A server that never becomes
        healthy ends the run (ServerStartError propagates)."""
        tracer = provider.get_tracer("otel_ttft.replay")
        span = tracer.start_span(semconv.SPAN_REPLAY_RUN, context=otel_context.Context(),
                                 start_time=clock.now_ns(), attributes=self.attributes())
        client = ChatClient(tracer, self.sampling, timeout_s, meter_provider)
        try:
            for scenario in self.scenarios:
                for index in range(self.repeat):
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
        self.progress.line(f"{scenario} #{index + 1}/{self.repeat}")
        if p.exclusive is not None:
            self.driver.switch_to(self._target(p.exclusive))
            self._last_model = p.exclusive  # a repeat of switch-back switches again
        if p.resident:
            self.driver.keep_resident([self._target(m) for m in p.resident])
        for model in p.warm:
            url = self.driver.url(self._target(model))
            client.warm(url, model, self.prompts.short.messages())
            self._last_model = model
        for model in p.evict:
            path = self.checkpoints.get(model)
            if path is not None:
                evict_page_cache(path)
        for step in p.steps:
            self._timed(client, scenario, index, step)

    def _timed(self, client: ChatClient, scenario: str, index: int, step: Step) -> None:
        target = self._target(step.model)
        switch_from = self._last_model if self._last_model != step.model else None

        def before_send() -> str:
            if step.resident:
                return self.driver.url(target)
            return self.driver.switch_to(target, cold=step.cold)

        attrs = {semconv.ATTR_REPLAY_RUN_ID: self.run_id,
                 semconv.ATTR_REPLAY_SCENARIO: scenario,
                 semconv.ATTR_REPLAY_REPEAT_INDEX: index,
                 semconv.ATTR_REPLAY_PROMPT: step.prompt,
                 semconv.ATTR_REPLAY_SWITCH_FROM: switch_from}
        # Cold: the request waited for a switch (another model or adapter made way for it) or a
        # cold start; resident steps, and every step of the resident driver, never wait.
        cold = (self.driver.name != "resident" and not step.resident
                and (step.cold or switch_from is not None))
        metric_attrs = {semconv.ATTR_REPLAY_SCENARIO: scenario, semconv.ATTR_REQUEST_COLD: cold}
        messages = self.prompts.get(step.prompt).messages()
        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = [pool.submit(client.request, step.model, messages, before_send, attrs,
                                   metric_attributes=metric_attrs)
                       for _ in range(self.concurrency)]
            results = [f.result() for f in futures]
        self._last_model = step.model
        for result in results:
            self.records.append(Record(scenario, index, step, result))
            ttft = f"{result.ttft_s:.3f} s" if result.ttft_s is not None else "-"
            self.progress.line(f"  {step.model} [{step.prompt}] client TTFT {ttft}"
                               + (f"  error: {result.error}" if result.error else ""))
        start_errors = [r.error for r in results if r.error and "ServerStartError" in r.error]
        if start_errors:
            raise ServerStartError(start_errors[0])


def evict_page_cache(model_dir: Path) -> None:
    """Drop the checkpoint's clean pages from the page cache (POSIX_FADV_DONTNEED per file)."""
    for path in sorted(Path(model_dir).iterdir()):
        if path.is_file():
            pagecache.evict(path)
