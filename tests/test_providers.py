"""Providers given to ``instrument()`` are used for everything we create: our spans, the stage
tagger and in-flight tracker, the in-progress gauge, the drop counter, bounded export and the
flushes; the global providers, SDK ones with readers of their own, get none of it.

In a fresh interpreter: global providers can be set once per process, and the tracker and
bounded export are attached once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from otel_ttft import semconv

SCRIPT = textwrap.dedent('''
    import json, time
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def tracing():
        tp, now, batched = TracerProvider(), InMemorySpanExporter(), InMemorySpanExporter()
        tp.add_span_processor(SimpleSpanProcessor(now))
        tp.add_span_processor(BatchSpanProcessor(batched, schedule_delay_millis=3_600_000))
        return tp, now, batched

    def metering():
        reader = InMemoryMetricReader()
        return MeterProvider(metric_readers=[reader]), reader

    def names(reader):
        data = reader.get_metrics_data()
        return sorted({m.name for rm in (data.resource_metrics if data else ())
                       for sm in rm.scope_metrics for m in sm.metrics})

    global_tp, global_now, global_batched = tracing()
    global_mp, global_reader = metering()
    trace.set_tracer_provider(global_tp)
    metrics.set_meter_provider(global_mp)
    tp, now, batched = tracing()
    mp, reader = metering()

    from otel_ttft import semconv
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
    from otel_ttft.runtime.telemetry import bounded_export, inflight, pipeline, sdk_internals, spans

    VllmTTFTInstrumentor().instrument(tracer_provider=tp, meter_provider=mp, skip_dep_check=True)
    vllm_name = "Overall Loading"  # a span vLLM opens itself: the tagger adds its stage
    out = {}
    root = spans.tracer().start_span(semconv.SPAN_ACTIVATION)
    with trace.use_span(root), spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ):
        for where, provider in (("private", tp), ("global", global_tp)):
            span = provider.get_tracer("vllm").start_span(vllm_name)
            out[f"tagged_{where}"] = semconv.ATTR_STAGE in (span.attributes or {})
            span.end()
        bounded_export.count_dropped("spans", semconv.DROP_EXPORT_FAILED, 3)
        out["metrics_private"], out["metrics_global"] = names(reader), names(global_reader)
    root.end()
    global_tp.get_tracer("t").start_span("global span").end()  # stays queued: not flushed
    spans.flush_async()
    deadline = time.monotonic() + 30
    while not batched.get_finished_spans() and time.monotonic() < deadline:
        time.sleep(0.05)
    out["flushed_private"] = len(batched.get_finished_spans())
    out["flushed_global"] = len(global_batched.get_finished_spans())
    out["ours_private"] = sorted({s.name for s in now.get_finished_spans()} - {vllm_name})
    out["ours_global"] = sorted({s.name for s in global_now.get_finished_spans()}
                                - {vllm_name, "global span"})
    out["tracker_on"] = [where for where, provider in (("private", tp), ("global", global_tp))
                         if inflight.tracker() in sdk_internals.span_processors(provider)]
    out["hardened"] = [where for where, provider in (("private tp", tp), ("private mp", mp),
                                                     ("global tp", global_tp),
                                                     ("global mp", global_mp))
                       if provider in bounded_export._providers]
    print(json.dumps(out))
''')


def test_everything_we_create_uses_the_providers_given_to_instrument():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["tagged_private"] and not out["tagged_global"]
    assert {semconv.METRIC_ACTIVATION_STAGE_IN_PROGRESS, semconv.METRIC_TELEMETRY_DROPPED} <= set(
        out["metrics_private"]), out
    assert out["metrics_global"] == [], out
    assert out["flushed_private"] >= 2 and out["flushed_global"] == 0, out
    assert {semconv.SPAN_ACTIVATION, semconv.SPAN_SHARD_READ} <= set(out["ours_private"]), out
    assert out["ours_global"] == []
    assert out["tracker_on"] == ["private"]
    assert out["hardened"] == ["private tp", "private mp"]
