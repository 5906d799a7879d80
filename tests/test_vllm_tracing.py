"""vLLM's ``--otlp-traces-endpoint`` beside our tracer provider (issue 55): vLLM's real
``init_tracer`` under our hook says, once, that the URL receives nothing from this process and
how to send there instead; with no provider installed before it (the plugin alone) it says
nothing."""

from __future__ import annotations

import logging
import os

import pytest
from opentelemetry import trace

from otel_ttft.runtime.hooks import vllm_tracing

pytestmark = [pytest.mark.vllm_import, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

URL = "http://127.0.0.1:9/v1/traces"


@pytest.fixture
def init_tracer(hooks, monkeypatch):
    """vLLM's own ``init_tracer``, hooked; vLLM's write of the endpoint into the environment is
    undone after the test."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "unset-by-test")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    hooks(*vllm_tracing.HOOKS)
    import vllm.tracing

    return vllm.tracing.init_tracer


def test_the_endpoint_vllm_was_given_is_named_with_the_fix(init_tracer, caplog, exporter):
    assert vllm_tracing.provider_in_force()  # the tests' SDK provider, as ours in a server
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        init_tracer("vllm.llm_engine", URL)
    (record,) = [r for r in caplog.records if "--otlp-traces-endpoint" in r.getMessage()]
    text = record.getMessage()
    assert URL in text and "split over two backends" in text
    assert f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={URL}" in text
    assert os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == URL  # what the children inherit


def test_with_vllms_provider_alone_nothing_is_said(init_tracer, caplog, monkeypatch):
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    with caplog.at_level(logging.WARNING, logger="otel_ttft"):
        init_tracer("vllm.llm_engine", URL)
    assert not [r for r in caplog.records if "--otlp-traces-endpoint" in r.getMessage()]
