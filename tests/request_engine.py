"""A real vLLM ``AsyncLLM`` (its ``generate`` and ``abort``) over a real ``OutputProcessor``, with
the engine core client and ``add_request``'s input processing stood in for; the request tests
(test_request_abort, test_request_vllm033) feed it outputs step by step. The ``engine`` fixture
(tests/conftest.py) builds one on the tiny model's tokenizer."""

from __future__ import annotations

import time
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime import config

_config = [config.Config()]  # what the ``telemetry`` fixture hands the hooks, as instrument() does


def use_config(cfg: config.Config) -> None:
    """Parts made from now on get ``cfg`` (its providers), as ``instrument(...)`` would give."""
    _config[0] = cfg


def current_config() -> config.Config:
    return _config[0]


def our_tracer() -> Any:
    """Our tracer on the test's provider (the one ``use_config`` gave, else the global one)."""
    from opentelemetry import trace

    return trace.get_tracer("otel_ttft", tracer_provider=_config[0].tracer_provider)


_made: list[Any] = []  # the states made during one test: closed after it (conftest)


def process_state() -> Any:
    """A process's state as ``_instrument`` builds it, from the test's config; closed after the
    test (an open state keeps its stage-metrics part and identity open for every later test)."""
    from otel_ttft.runtime.hooks import all_parts
    from otel_ttft.runtime.state import ProcessState

    _made.append(ProcessState(_config[0], all_parts()))
    return _made[-1]


def close_states() -> None:
    """Close the states the test made, newest first."""
    while _made:
        _made.pop().close()


def api_part() -> Any:
    """The API server's request part (``request.api``) of such a state."""
    return process_state().part("request.api")


class EngineCoreClient:
    """Stands in for the EngineCore client: records what it is asked to abort."""

    def __init__(self):
        self.aborted: list[str] = []

    async def abort_requests_async(self, request_ids):
        self.aborted.extend(request_ids)

    def shutdown(self, timeout=None):
        pass


class Engine:
    """A real ``AsyncLLM`` (its ``generate`` and ``abort``) over a real ``OutputProcessor``;
    outputs are fed by the test where vLLM's output handler would."""

    def __init__(self, tokenizer):
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import OutputProcessor

        self.processor = OutputProcessor(tokenizer, log_stats=True, stream_interval=1,
                                         tracing_enabled=False)
        llm = AsyncLLM.__new__(AsyncLLM)  # its __init__ starts an engine; generate does not
        llm.output_processor = self.processor
        llm.engine_core = EngineCoreClient()
        llm.log_requests = False
        llm.add_request = self._add_request
        self.llm = llm

    async def _add_request(self, request_id, prompt, params, **kwargs):
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import RequestOutputCollector

        core = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=[11, 12, 13, 14], mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=time.time(),
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id=request_id, trace_headers=kwargs.get("trace_headers"))
        queue = RequestOutputCollector(params.output_kind, request_id)
        self.processor.add_request(core, prompt, None, 0, queue)
        return queue

    def step(self, rid: str, token: int, *, first: bool = False, finish: bool = False) -> None:
        """One engine step's output for ``rid``, through the real ``process_outputs``."""
        from vllm.v1.engine import (
            EngineCoreEvent,
            EngineCoreEventType,
            EngineCoreOutput,
            FinishReason,
        )
        from vllm.v1.metrics.stats import IterationStats

        now = time.monotonic()
        events = ([EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, now - 0.002),
                   EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, now - 0.001)]
                  if first else None)
        out = EngineCoreOutput(request_id=rid, new_token_ids=[token], events=events,
                               finish_reason=FinishReason.LENGTH if finish else None)
        self.processor.process_outputs([out], now, IterationStats())


def params(max_tokens: int):
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0,
                          output_kind=RequestOutputKind.DELTA)


def request_span(exporter):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_REQUEST]
    return span
