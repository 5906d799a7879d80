"""Issue 57: coexisting with ``opentelemetry-distro``, the package the contrib docs tell everyone to
install. It registers a second configurator (``configurator``) and distro (``distro``), and
``opentelemetry-instrument`` runs the first it finds unless ``OTEL_PYTHON_CONFIGURATOR`` /
``OTEL_PYTHON_DISTRO`` name one. "First" is the order of distributions on ``sys.path`` (and,
within one site-packages, the order the file system lists it: no order an install promises).

The real package, installed beside the project's environment in an overlay (as
``scripts/oldest-otel`` builds one: a venv whose ``.pth`` files add the project's site-packages),
in two layouts that give both orders. A probe named ``vllm`` (so the gate takes it for vLLM's
process, without importing vLLM) reports the provider's processors. Whichever configurator runs,
our processors are on the provider; where it is not ours, one WARNING line says
``OTEL_PYTHON_CONFIGURATOR=otel_ttft``, and that setting gives our configurator back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from otel_ttft.runtime import distro

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = Path(os.environ.get("OTEL_TTFT_DISTRO_OVERLAY", ROOT / ".venv-with-distro"))
INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")
# The distro release that goes with the installed opentelemetry-instrumentation (it pins it ==).
DISTRO_VERSION = version("opentelemetry-instrumentation")
RESTORE = "OTEL_PYTHON_CONFIGURATOR=otel_ttft"

PROBE = textwrap.dedent('''
    import json, sys
    from opentelemetry import trace
    from otel_ttft.runtime import distro
    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor
    provider = trace.get_tracer_provider()
    multi = getattr(provider, "_active_span_processor", None)  # what the test reads, not us
    print(json.dumps({
        "configurators": [name for name, _ in distro.configurators()],
        "provider": type(provider).__module__ + "." + type(provider).__name__,
        "processors": [type(p).__name__ for p in getattr(multi, "_span_processors", ())],
        "ids": type(getattr(provider, "id_generator", None)).__name__,
        "instrumented": VllmTTFTInstrumentor().is_instrumented_by_opentelemetry,
        "vllm_imported": "vllm" in sys.modules}))
''')
OURS = ["StageTagger", "InflightTracker", "StageLedger"]


def _site(python: Path) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def _overlay() -> dict[str, Path]:
    """The overlay, built once per distro version (a stamp): ``distro/`` holds the real package
    (``pip --target``, no dependencies: every one is in the project's environment at the
    version it pins); ``theirs-first`` and ``ours-first`` are venvs whose ``.pth`` files put it
    before or after the project's site-packages; ``code/`` our package alone (the repository
    root also holds an ``otel_ttft.egg-info``, which would put ours first in both)."""
    stamp = OVERLAY / f".stamp-{DISTRO_VERSION}"
    layouts = {"theirs-first": OVERLAY / "theirs-first", "ours-first": OVERLAY / "ours-first"}
    if not stamp.exists():
        subprocess.run(["rm", "-rf", str(OVERLAY)], check=True)
        OVERLAY.mkdir(parents=True)
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
             "--disable-pip-version-check", "--target", str(OVERLAY / "distro"),
             f"opentelemetry-distro=={DISTRO_VERSION}"],
            capture_output=True, text=True, timeout=300)
        if pip.returncode != 0:
            subprocess.run(["rm", "-rf", str(OVERLAY)], check=False)
            pytest.skip(f"opentelemetry-distro=={DISTRO_VERSION} could not be installed: "
                        + pip.stderr.strip()[-500:])
        base_site = sysconfig.get_paths()["purelib"]
        project = f"import site; site.addsitedir({base_site!r})\n"
        theirs = f"{OVERLAY / 'distro'}\n"
        for name, (first, second) in {"theirs-first": (theirs, project),
                                      "ours-first": (project, theirs)}.items():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(layouts[name])],
                           check=True)
            site = Path(_site(layouts[name] / "bin" / "python"))
            (site / "00-first.pth").write_text(first)
            (site / "zz-second.pth").write_text(second)
        stamp.touch()
    code = OVERLAY / "code"
    code.mkdir(exist_ok=True)
    link = code / "otel_ttft"
    if not link.is_symlink() or link.resolve() != ROOT / "otel_ttft":  # this checkout's code
        link.unlink(missing_ok=True)
        link.symlink_to(ROOT / "otel_ttft")
    return {**layouts, "code": code}


@pytest.fixture(scope="module")
def overlay() -> dict[str, Path]:
    return _overlay()


def _env(overlay: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTHON"))}
    env.update(PYTHONPATH=str(overlay["code"]),
               OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",  # nothing listens: nothing sent
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="600000",
               OTEL_BSP_SCHEDULE_DELAY="600000", **extra)
    return env


def run_probe(overlay: dict[str, Path], layout: str, tmp_path: Path,
              **extra: str) -> tuple[dict, str]:
    """``opentelemetry-instrument <overlay python> vllm`` from an empty directory (the tool puts
    the working directory on ``PYTHONPATH``); the probe's report and the process's stderr."""
    script = tmp_path / "vllm"  # the gate: a script named vllm is vLLM's process
    script.write_text(PROBE)
    python = overlay[layout] / "bin" / "python"
    proc = subprocess.run([INSTRUMENT, str(python), str(script)], capture_output=True, text=True,
                          timeout=180, env=_env(overlay, **extra), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _warnings(stderr: str) -> list[str]:
    """Our configurator lines (one per vLLM process); not the verdict's own ``otel-ttft:``."""
    return [line for line in stderr.splitlines()
            if line.startswith("otel-ttft: opentelemetry-instrument ran configurator")]


def test_theirs_found_first_ours_join_its_provider_and_the_log_names_the_setting(overlay,
                                                                                 tmp_path):
    out, err = run_probe(overlay, "theirs-first", tmp_path)
    assert out["configurators"] == ["configurator", "otel_ttft"], out  # the layout's order
    assert out["provider"] == "opentelemetry.sdk.trace.TracerProvider", out
    # opentelemetry-distro's configurator built it (its exporting processor first), ours joined
    assert out["processors"][0] == "BatchSpanProcessor", out
    assert out["processors"][1:] == OURS, out
    assert out["ids"] == "PrivateIdGenerator", out  # not the global random vLLM seeds
    assert out["instrumented"] and not out["vllm_imported"], out
    lines = _warnings(err)
    assert len(lines) == 1, err
    assert "ran configurator 'configurator', not ours" in lines[0], lines
    assert "live verdict ledger" in lines[0] and lines[0].endswith(f"set {RESTORE} to restore "
                                                                   "them"), lines


def test_ours_found_first_builds_the_provider_and_logs_nothing(overlay, tmp_path):
    out, err = run_probe(overlay, "ours-first", tmp_path)
    assert out["configurators"] == ["otel_ttft", "configurator"], out
    assert out["processors"][:3] == OURS and "SpanCounter" in out["processors"], out
    assert out["processors"].count("StageTagger") == 1, out
    assert out["ids"] == "PrivateIdGenerator", out
    assert out["instrumented"], out
    assert _warnings(err) == [], err


@pytest.mark.parametrize("layout", ["theirs-first", "ours-first"])
def test_the_setting_the_log_names_gives_our_configurator_back(overlay, tmp_path, layout):
    out, err = run_probe(overlay, layout, tmp_path, OTEL_PYTHON_CONFIGURATOR="otel_ttft")
    assert out["processors"][:3] == OURS and "SpanCounter" in out["processors"], out
    assert _warnings(err) == [], err


def test_a_configurator_name_nothing_registers_is_said(overlay, tmp_path):
    """``OTEL_PYTHON_CONFIGURATOR=sdk`` (what our docs once said): no configurator runs at all."""
    out, err = run_probe(overlay, "theirs-first", tmp_path, OTEL_PYTHON_CONFIGURATOR="sdk")
    assert out["provider"] == "opentelemetry.trace.ProxyTracerProvider", out
    lines = _warnings(err)
    assert len(lines) == 1 and "OTEL_PYTHON_CONFIGURATOR='sdk' names no installed" in lines[0], err
    assert lines[0].endswith(f"set {RESTORE} to restore them"), lines


DOCTOR = ("import json; from otel_ttft.tools import doctor; o = doctor._opentelemetry(); "
          "print(json.dumps({'otel': o, 'text': doctor._render_opentelemetry(o)}))")


@pytest.mark.parametrize(("layout", "chosen", "picked", "note"), [
    ("theirs-first", None, "configurator", "NOTE    configurator: configurator (not ours, from "
                                           "opentelemetry-distro"),
    ("ours-first", None, "otel_ttft", "NOTE    configurator: otel_ttft (found first of otel_ttft"),
    ("theirs-first", "otel_ttft", "otel_ttft", "ok      configurator: otel_ttft"),
    ("ours-first", "sdk", "none", "NOTE    configurator: none (not ours: "
                                  "OTEL_PYTHON_CONFIGURATOR='sdk' names none of"),
])
def test_doctor_names_the_configurator_that_runs_and_the_setting(overlay, layout, chosen, picked,
                                                                 note, tmp_path):
    extra = {"OTEL_PYTHON_CONFIGURATOR": chosen} if chosen else {}
    proc = subprocess.run([str(overlay[layout] / "bin" / "python"), "-c", DOCTOR],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env=_env(overlay, **extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["otel"]["configurator"] == picked, out
    line = out["text"][1]
    assert line.startswith(f"  {note}"), line
    assert (RESTORE in line) == (chosen != "otel_ttft"), line


@pytest.mark.vllm
def test_a_real_server_with_theirs_found_first_still_gives_its_live_verdict(overlay, receiver,
                                                                           tiny_model, tmp_path,
                                                                           monkeypatch):
    """The acceptance of issue 57: ``opentelemetry-distro``'s configurator builds the providers
    of every vLLM process (API server, EngineCore, worker); the live verdict still comes, and the
    log names the setting in each vLLM process (API server, EngineCore, worker)."""
    from otel_ttft import semconv
    from otel_ttft.tools.replay.server import VllmServer
    from tests.export_env import EXPORT_ENV
    from tests.vllm_args import EAGER_ARGS

    monkeypatch.chdir(tmp_path)  # opentelemetry-instrument puts the working directory first
    env = {**EXPORT_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_TTFT_VERDICT_HISTORY": str(tmp_path / "history.json"),
           "PYTHONPATH": str(overlay["code"]), "OTEL_PYTHON_CONFIGURATOR": None,
           "OTEL_PYTHON_DISTRO": None}
    log = tmp_path / "server.log"
    server = VllmServer(tiny_model, env=env, instrument=False, log_path=log,
                        python=str(overlay["theirs-first"] / "bin" / "python"),
                        extra_args=(*EAGER_ARGS, "--max-model-len", "512", "--max-num-seqs", "4"))
    server.argv = [INSTRUMENT, *server.command()]
    with server:
        receiver.wait_for_spans(lambda spans: [s for s in spans
                                               if s["name"] == semconv.SPAN_ACTIVATION_VERDICT],
                                120)
    text = log.read_text(errors="replace")
    skipped = "Configuration of otel_ttft not loaded, configurator already loaded"
    assert skipped in text, text[-3000:]  # opentelemetry-instrument's own line
    assert any("otel-ttft: this start of" in line for line in text.splitlines()), text[-3000:]
    warned = _warnings(text)
    assert warned and all("ran configurator 'configurator', not ours" in w
                          and RESTORE in w for w in warned), warned


def test_configurator_in_force_follows_opentelemetry_instrument():
    """Without the overlay: the one the setting names, else the first found, else none."""
    assert distro.configurator_in_force({}) == "otel_ttft"  # the only one in this environment
    assert distro.configurator_in_force({"OTEL_PYTHON_CONFIGURATOR": "otel_ttft"}) == "otel_ttft"
    assert distro.configurator_in_force({"OTEL_PYTHON_CONFIGURATOR": "sdk"}) is None
    assert distro.RESTORE == RESTORE
