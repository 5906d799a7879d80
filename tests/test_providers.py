"""Providers given to ``instrument()`` are used for everything we create (our spans, our
instruments, the flushes), and instrumenting never changes them: no processor of ours is added,
so uninstrumenting leaves them as they were. The global providers get none of it.

In a fresh interpreter: global providers can be set once per process."""

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

    def processors(tp):  # the SDK's private list: read by this test only, never by the runtime
        return list(tp._active_span_processor._span_processors)

    global_tp, global_now, global_batched = tracing()
    global_mp, global_reader = metering()
    trace.set_tracer_provider(global_tp)
    metrics.set_meter_provider(global_mp)
    tp, now, batched = tracing()
    mp, reader = metering()
    before = processors(tp)

    from otel_ttft import semconv
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
    from otel_ttft.runtime.telemetry import metrics as our_metrics, spans

    instrumentor = VllmTTFTInstrumentor()
    instrumentor.instrument(tracer_provider=tp, meter_provider=mp, skip_dep_check=True)
    out = {"processors_kept": processors(tp) == before}
    state = instrumentor.state  # what every hook is handed
    root = state.tracer.start_span(semconv.SPAN_ACTIVATION)
    with trace.use_span(root), spans.stage_span(semconv.SPAN_SHARD_READ, semconv.STAGE_LOAD_READ,
                                                tracer=state.tracer, identity=state.identity):
        state.part(our_metrics.PART).record_activation_stage(semconv.STAGE_LOAD_READ, 1.5, "m")
        out["metrics_private"], out["metrics_global"] = names(reader), names(global_reader)
    root.end()
    global_tp.get_tracer("t").start_span("global span").end()  # stays queued: not flushed
    spans.flush_async(state.config)
    deadline = time.monotonic() + 30
    while not batched.get_finished_spans() and time.monotonic() < deadline:
        time.sleep(0.05)
    out["flushed_private"] = len(batched.get_finished_spans())
    out["flushed_global"] = len(global_batched.get_finished_spans())
    out["ours_private"] = sorted({s.name for s in now.get_finished_spans()})
    out["ours_global"] = sorted({s.name for s in global_now.get_finished_spans()}
                                - {"global span"})
    instrumentor.uninstrument()
    out["processors_after"] = processors(tp) == before
    print(json.dumps(out))
''')


def test_everything_we_create_uses_the_providers_given_to_instrument_and_changes_none():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["processors_kept"] and out["processors_after"], out
    assert semconv.METRIC_ACTIVATION_STAGE_DURATION in out["metrics_private"], out
    assert out["metrics_global"] == [], out
    assert out["flushed_private"] >= 2 and out["flushed_global"] == 0, out
    assert {semconv.SPAN_ACTIVATION, semconv.SPAN_SHARD_READ} <= set(out["ours_private"]), out
    assert out["ours_global"] == []
