"""A small real store for the commands' hostile-input tests: a replay-shaped run (a cold switch
with its activation, then warm requests; ``analysis_fixtures``) sent by the OpenTelemetry SDK's
own OTLP/HTTP exporters to the embedded receiver on 127.0.0.1, metrics included.

Built once per session; each test mutates a copy (``copy_store``), so the original stays good.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from otel_ttft.tools.sink.receiver import OTLPReceiver
from otel_ttft.tools.sink.store import DB_FILE, SpanStore
from tests import analysis_fixtures as fx

RESOURCE = Resource.create({"service.name": "hostile-test", "vllm.process_kind": "api"})
TIMEOUT_S = 60


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False)


def readable(span: dict) -> ReadableSpan:
    """A normalized span dict (``analysis_fixtures``) as the SDK's finished span."""
    parent = span.get("parent_span_id")
    return ReadableSpan(
        span["name"], context=_context(span["trace_id"], span["span_id"]),
        parent=_context(span["trace_id"], parent) if parent else None, resource=RESOURCE,
        attributes=span["attributes"], kind=SpanKind[span.get("kind", "INTERNAL")],
        events=[Event("mark", {"i": 1}, span["start_ns"])],
        links=[Link(_context(lk["trace_id"], lk["span_id"] if int(lk["span_id"], 16) else
                             "1" * 16), lk["attributes"]) for lk in span.get("links") or []],
        status=Status(StatusCode.OK), start_time=span["start_ns"], end_time=span["end_ns"],
        instrumentation_scope=InstrumentationScope("otel_ttft.hostile"))


def fixture_spans() -> list[dict]:
    return fx.cold_switch_run()


def build_store(directory: Path) -> Path:
    """Send the run's spans and a histogram through the real exporters into a store there."""
    receiver = OTLPReceiver(SpanStore(directory), grpc_port=None)
    with receiver:
        exporter = OTLPSpanExporter(endpoint=f"{receiver.http_endpoint}/v1/traces")
        assert exporter.export([readable(s) for s in fixture_spans()]) == SpanExportResult.SUCCESS
        exporter.shutdown()
        reader = InMemoryMetricReader()
        provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
        hist = provider.get_meter("otel_ttft.hostile").create_histogram("ttft.request.ttft",
                                                                       unit="s")
        hist.record(0.25, {"ttft.stage": "prefill"})
        metrics = OTLPMetricExporter(endpoint=f"{receiver.http_endpoint}/v1/metrics")
        assert metrics.export(reader.get_metrics_data()) == MetricExportResult.SUCCESS
        metrics.shutdown()
        provider.shutdown()
    receiver.store.close()
    # A store as a user hands it over: one file, the write-ahead log folded in.
    with sqlite3.connect(directory / DB_FILE) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return directory


def copy_store(pristine: Path, target: Path) -> Path:
    shutil.copytree(pristine, target)
    return target


def sql(store: Path, statement: str, params: tuple = ()) -> None:
    """Damage a store copy the way a disk, a foreign writer or a user with sqlite3 would."""
    conn = sqlite3.connect(store / DB_FILE)
    try:
        conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


def cli(*args: str, timeout: float = TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    """The command as a user runs it: a separate process, with a hard timeout (a hang fails)."""
    return subprocess.run([sys.executable, "-m", "otel_ttft.tools.cli", *args],
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def assert_refused(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    """Exit 2 (or ``code``), one line on stderr naming the problem, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 1000, proc.stderr[-2000:]
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes: what a refused command must not change."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def unchanged(before: dict[str, bytes], directory: Path) -> bool:
    """Nothing new or changed, SQLite's own sidecars of a reader aside (-shm, an empty -wal)."""
    def real(files: dict[str, bytes]) -> dict[str, bytes]:
        return {k: v for k, v in files.items()
                if not k.endswith("-shm") and not (k.endswith("-wal") and not v)}
    return real(snapshot(directory)) == real(before)


def full_device(tmp_path: Path) -> Path:
    """A writable device that is always full. As root, a private node (so a regression
    replaces only that, never the real /dev/full); otherwise /dev/full, which a non-root
    process cannot replace."""
    if os.geteuid() != 0:
        return Path("/dev/full")
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except OSError as exc:
        pytest.skip(f"cannot make a private device node ({exc}); not risking /dev/full as root")
    return node


def file_size_limit(limit: int):
    """preexec_fn: writes past ``limit`` bytes fail with EFBIG, as on a full disk."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return apply


__all__ = ["assert_refused", "build_store", "cli", "copy_store", "file_size_limit", "full_device",
           "snapshot", "sql", "unchanged"]
