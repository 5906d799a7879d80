"""The replay client: streamed chat completions, timed and traced on the one clock.

Its spans and its metric (``gen_ai.client.operation.time_to_first_chunk``) go over real OTLP
exporters from providers of its own (never the global ones), as service ``otel-ttft-replay``.
Each request's span is the root of the request's trace and is sent as ``traceparent``, so vLLM's
``llm_request`` becomes its child.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.version import __version__

CLIENT_NAME = f"{semconv.REPLAY_SERVICE_NAME} {__version__} / openai chat streaming"


@dataclass(frozen=True)
class Sampling:
    """Fixed for a whole run, so that only the intended state changes between scenarios."""

    temperature: float = 0.0
    max_tokens: int = 16
    seed: int = 1234
    logprobs: int = 0
    """Top logprobs asked per token by every request but probes (0: none): serving paths a
    server warmed by probes alone meets first in a user's request."""

    def record(self) -> str:
        fields: dict[str, float] = {"temperature": self.temperature,
                                    "max_tokens": self.max_tokens, "seed": self.seed}
        if self.logprobs:  # absent when off: records of earlier runs compare equal
            fields["logprobs"] = self.logprobs
        return json.dumps(fields, sort_keys=True)


@dataclass
class RequestResult:
    model: str
    ttft_s: float | None = None  # request made -> first content chunk
    sent_ns: int | None = None  # HTTP request actually sent (epoch ns, one clock)
    input_tokens: int | None = None
    output_chars: int = 0
    error: str | None = None
    trace_id: str | None = None


def _resource() -> Resource:
    return Resource.create({"service.name": semconv.REPLAY_SERVICE_NAME,
                            "service.version": __version__})


def make_tracer_provider(endpoint: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Our own provider exporting to ``endpoint`` (OTLP/HTTP base URL, like vLLM's)."""
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=10)
    provider = TracerProvider(resource=_resource())
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def make_meter_provider(endpoint: str, reader: MetricReader | None = None) -> MeterProvider:
    """Our own meter provider, OTLP/HTTP to the same ``endpoint`` as the spans (cumulative, read
    every 5 s; the run flushes it at its end)."""
    if reader is None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint.rstrip("/") + "/v1/metrics", timeout=10),
            export_interval_millis=5000, export_timeout_millis=10_000)
    return MeterProvider(metric_readers=[reader], resource=_resource())


def client_ttft_histogram(meter_provider: MeterProvider) -> Histogram:
    """``gen_ai.client.operation.time_to_first_chunk`` with our TTFT buckets: a request that
    waits for a cold start takes minutes, far past the SDK's default 10 s."""
    return meter_provider.get_meter("otel_ttft.tools.replay", __version__).create_histogram(
        semconv.METRIC_CLIENT_TIME_TO_FIRST_CHUNK, unit="s",
        description="Time to the first content chunk of a streamed chat completion, client side "
                    "(request made -> first chunk, switch or cold start included)",
        explicit_bucket_boundaries_advisory=list(semconv.TTFT_BUCKETS_S))


_gc_lock = threading.Lock()
_gc_holders = 0


def _hold_heap() -> None:
    """The heap as it is now leaves the collector's sight while a client is open. A process that
    loaded a tokenizer holds about a million objects; a full collection then stops every thread
    for 20-340 ms (measured in the test process), and a client thread stopped while its first
    chunk arrives reports the pause as TTFT: its ``network`` stage. Collected once first, so the
    pause comes before any request is timed; unfrozen when the last client closes."""
    global _gc_holders
    with _gc_lock:
        if _gc_holders == 0:
            gc.collect()
            gc.freeze()
        _gc_holders += 1


def _release_heap() -> None:
    global _gc_holders
    with _gc_lock:
        _gc_holders -= 1
        if _gc_holders == 0:
            gc.unfreeze()


@dataclass
class ChatClient:
    """One client for the whole run (one connection pool, one set of sampling settings). While
    it is open, the process's heap as it was is frozen (``gc.freeze``): see ``_hold_heap``."""

    tracer: trace.Tracer
    sampling: Sampling
    timeout_s: float = 300.0
    meter_provider: MeterProvider | None = None  # None: no client TTFT metric
    _http: httpx.Client = field(init=False, repr=False)
    _ttft: Histogram | None = field(init=False, repr=False, default=None)
    _holding: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if self.meter_provider is not None:
            self._ttft = client_ttft_histogram(self.meter_provider)
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=10.0),
                                  event_hooks={"request": [self._on_send]})
        self._local = threading.local()  # the send hook runs in the requesting thread
        _hold_heap()
        self._holding = True

    def close(self) -> None:
        self._http.close()
        if self._holding:
            self._holding = False
            _release_heap()

    def _on_send(self, request: httpx.Request) -> None:
        self._local.sent_ns = clock.now_ns()

    def body(self, model: str, messages: list[dict[str, str]], *,
             probe: bool = False) -> dict[str, Any]:
        """The request's JSON; a ``probe`` (a readiness check) asks for no logprobs."""
        body = {"model": model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True},
                "temperature": self.sampling.temperature, "max_tokens": self.sampling.max_tokens,
                "seed": self.sampling.seed}
        if self.sampling.logprobs and not probe:
            body.update(logprobs=True, top_logprobs=self.sampling.logprobs)
        return body

    def request(self, model: str, messages: list[dict[str, str]],
                before_send: Callable[[], str], attributes: Mapping[str, Any], *,
                metric_attributes: Mapping[str, Any] | None = None,
                after_switch: Callable[[], Mapping[str, Any]] | None = None) -> RequestResult:
        """One ``replay.request``: the span starts now (the request is made), ``before_send``
        makes the model available (a switch) and returns the base URL, ``after_switch`` gives
        attributes only known then (how the server was warmed, what the eviction measured),
        then the request goes. A first chunk also records the client TTFT histogram, with
        ``metric_attributes`` (few, low-cardinality: scenario, cold) besides the operation and
        the model."""
        result = RequestResult(model)
        self._local.sent_ns = None
        start = clock.now_ns()
        span = self.tracer.start_span(semconv.SPAN_REPLAY_REQUEST, context=otel_context.Context(),
                                      kind=SpanKind.CLIENT, start_time=start)
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        span.set_attribute(semconv.GEN_AI_REQUEST_MODEL, model)
        result.trace_id = format(span.get_span_context().trace_id, "032x")
        try:
            base_url = before_send()
            if after_switch is not None:
                span.set_attributes({k: v for k, v in after_switch().items() if v is not None})
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers, trace.set_span_in_context(span))
            self._stream(base_url, model, messages, headers, start, result)
        except Exception as exc:  # noqa: BLE001 - any failure becomes the span's error
            result.error = _one_line(exc)
        finally:
            result.sent_ns = getattr(self._local, "sent_ns", None)
            if result.sent_ns is not None:
                span.set_attribute(semconv.ATTR_CLIENT_REQUEST_SENT_NS, result.sent_ns)
            if result.ttft_s is not None:
                span.set_attribute(semconv.ATTR_CLIENT_TTFT, result.ttft_s)
                self._record_ttft(result, span, metric_attributes or {})
            if result.input_tokens is not None:
                span.set_attribute(semconv.GEN_AI_USAGE_INPUT_TOKENS, result.input_tokens)
            if result.error is None and result.ttft_s is None:
                result.error = "the response had no content"
            if result.error is not None:
                span.set_attribute(semconv.ATTR_REPLAY_ERROR, result.error)
                span.set_status(Status(StatusCode.ERROR, result.error))
            span.end(end_time=clock.now_ns())
        return result

    def _record_ttft(self, result: RequestResult, span: trace.Span,
                     extra: Mapping[str, Any]) -> None:
        """The span's context goes with the value, so the exemplar names the request's trace."""
        if self._ttft is None or result.ttft_s is None:
            return
        attrs = {semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
                 semconv.GEN_AI_REQUEST_MODEL: result.model,
                 **{k: v for k, v in extra.items() if v is not None}}
        self._ttft.record(result.ttft_s, attrs, context=trace.set_span_in_context(span))

    def warm(self, base_url: str, model: str, messages: list[dict[str, str]], *,
             probe: bool = False) -> None:
        """An untraced request that puts the model in the state the scenario starts from; a
        ``probe`` is a bare one (no logprobs), as a readiness check sends."""
        result = RequestResult(model)
        self._stream(base_url, model, messages, {}, clock.now_ns(), result, probe=probe)
        if result.ttft_s is None:
            raise RuntimeError(f"warm-up request to {model} at {base_url} got no content")

    def _stream(self, base_url: str, model: str, messages: list[dict[str, str]],
                headers: dict[str, str], start_ns: int, result: RequestResult, *,
                probe: bool = False) -> None:
        url = base_url.rstrip("/") + "/v1/chat/completions"
        with self._http.stream("POST", url, json=self.body(model, messages, probe=probe),
                               headers=headers) as resp:
            if resp.status_code != 200:
                detail = resp.read().decode(errors="replace")[:200].replace("\n", " ")
                raise RuntimeError(f"HTTP {resp.status_code} from {url}: {detail}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if result.ttft_s is None:
                            result.ttft_s = (clock.now_ns() - start_ns) / 1e9
                        result.output_chars += len(content)
                usage = chunk.get("usage")
                if usage and usage.get("prompt_tokens") is not None:
                    result.input_tokens = int(usage["prompt_tokens"])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
