"""Every command that reads a store, a span file or an analysis.json, run as a batch scheduler or
a hardened host runs it: under a 1 GiB address-space limit (``ulimit -v 1048576``), where memory
reserved but never used counts as much as memory used. On an empty, a small and a normal input
each gives its result, or one line and a non-zero exit; never a traceback, never a
``MemoryError``. A file is read at the size it has, not at the cap for its kind (1 GiB for a
span file), and an input too large for the limit is refused in one line as well.

Each command runs as a separate process (``hostile_store.cli``) with the limit set before it
starts, as ``ulimit -v`` does.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ttft import semconv
from otel_ttft.tools.sink.store import SpanStore
from tests import analysis_fixtures as fx
from tests.hostile_store import assert_refused, cli

LIMIT = 1 << 30  # ulimit -v 1048576 (KiB)
SIZES = ("empty", "small", "normal")


def under_limit() -> None:
    """preexec_fn: the address-space limit, soft and hard, as ``ulimit -v`` sets it."""
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def limited(*args: str):
    return cli(*args, preexec_fn=under_limit)


def _store(directory: Path, spans: list[dict]) -> Path:
    store = SpanStore(directory)
    if spans:
        store.add_spans(spans)
    store.close()
    return directory


@pytest.fixture(scope="module")
def inputs(pristine_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``store-SIZE``, ``spans-SIZE`` (OTLP/JSON) and ``analysis-SIZE`` for each size: the
    small store is the hostile tests' real one, the normal one a replay of 500 warm requests
    after a cold switch (3,500 spans); the files are what ``export`` and ``analyze`` make of
    them (without a limit). The empty files are empty."""
    root = tmp_path_factory.mktemp("memory-limit")
    normal = fx.cold_switch_run() + fx.warm_requests(semconv.SCENARIO_SHORT_PROMPT, "B", 300.0,
                                                     n=500)
    found = {"store-empty": _store(root / "store-empty", []), "store-small": pristine_store,
             "store-normal": _store(root / "store-normal", normal)}
    for kind in ("spans", "analysis"):
        found[f"{kind}-empty"] = root / f"{kind}-empty.json"
        found[f"{kind}-empty"].write_bytes(b"")
    for size in ("small", "normal"):
        store, spans, analysis = (found[f"store-{size}"], root / f"spans-{size}.json",
                                  root / f"analysis-{size}.json")
        assert cli("export", str(store), "-o", str(spans)).returncode == 0
        assert cli("analyze", str(store), "--json", str(analysis)).returncode == 0
        found[f"spans-{size}"], found[f"analysis-{size}"] = spans, analysis
    return found


def _result(proc, *, exit_code: int = 0) -> None:
    """A clean result: the exit code, and nothing on stderr that looks like a crash."""
    assert proc.returncode == exit_code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("form", ("store", "spans"))
def test_span_commands_under_the_limit(inputs: dict[str, Path], tmp_path: Path, form: str,
                                       size: str) -> None:
    source = str(inputs[f"{form}-{size}"])
    tree = limited("tree", source)
    analysis = tmp_path / "analysis.json"
    analyze = limited("analyze", source, "--json", str(analysis))
    exported = tmp_path / "spans.otlp.json"
    export = limited("export", source, "-o", str(exported))
    if size != "empty":
        for proc in (tree, analyze, export):
            _result(proc)
        assert "llm_request" in tree.stdout or "vllm.activation" in tree.stdout
        assert json.loads(analysis.read_text())["requests"]
        assert exported.read_text().count("\n") >= 1
    elif form == "spans":  # an empty file: said so, nothing read, nothing written
        for command, proc in (("tree", tree), ("analyze", analyze), ("export", export)):
            assert_refused(proc, f"otel-ttft {command}: {source}: empty file")
        assert not analysis.exists() and not exported.exists()
    else:  # a store without spans: nothing to draw or analyze; an empty export
        assert_refused(tree, "otel-ttft tree: no spans in")
        assert_refused(analyze, "otel-ttft analyze: no requests with a first token",
                       "(0 spans read)")
        _result(export)
        assert exported.read_text() == "" and "0 spans written" in export.stdout


@pytest.mark.parametrize("size", SIZES)
def test_store_metrics_under_the_limit(inputs: dict[str, Path], tmp_path: Path,
                                       size: str) -> None:
    target = tmp_path / "history.om"
    proc = limited("prometheus", "--dir", str(inputs[f"store-{size}"]), "--openmetrics",
                   str(target))
    _result(proc)
    assert target.read_text().endswith("# EOF\n")


@pytest.mark.parametrize("size", SIZES)
def test_analysis_commands_under_the_limit(inputs: dict[str, Path], tmp_path: Path,
                                           size: str) -> None:
    analysis = str(inputs[f"analysis-{size}"])
    page = tmp_path / "report.html"
    report = limited("report", analysis, "-o", str(page))
    check = limited("check", analysis, analysis)  # a run against itself: nothing grew
    if size == "empty":
        assert_refused(report, f"otel-ttft report: {analysis}: empty file")
        assert_refused(check, f"otel-ttft check: {analysis}: empty file")
        assert not page.exists()
        return
    _result(report)
    _result(check)
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_a_span_file_larger_than_the_limit_holds_is_one_line(tmp_path: Path) -> None:
    """48 MB of JSON that parses into 16 million objects (over 1 GiB): the file is under its
    cap, so it is read, and the memory it needs is refused in one line."""
    big = tmp_path / "objects.json"
    with big.open("wb") as f:
        f.write(b"[")
        f.write(b"{}," * (16 * 1024 * 1024))
        f.write(b"{}]\n")
    for command in ("tree", "analyze"):
        proc = limited(command, str(big))
        assert_refused(proc, f"otel-ttft {command}: out of memory")


@pytest.mark.vllm_import
def test_the_vllm_probe_says_when_the_limit_is_why() -> None:
    """``analyze`` words its advice in the installed vLLM's flags, read by importing vLLM in a
    child process; vLLM and torch map more than 1 GiB, so under the limit that import fails and
    the verdicts say why their flags are unchecked (``analyze`` itself runs on)."""
    code = ("from otel_ttft.tools.analysis import knobs\n"
            "try:\n    knobs.probe()\nexcept knobs.KnobsUnavailable as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, preexec_fn=under_limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cannot read vLLM's parser" in proc.stdout
    assert "under an address-space limit of 1024 MiB, too little to import vLLM" in proc.stdout
