"""``otel-ttft verify``'s re-runs: one scenario per candidate change, through the same replay
(``replay.command``) with the recorded setup and only that change applied, into verify's own
store; the numbers are then ``analysis.verification``'s."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from otel_ttft.diagnosis import prefix
from otel_ttft.tools.analysis import change as changes
from otel_ttft.tools.analysis import knobs
from otel_ttft.tools.analysis.verification import (
    STATUS_FAILED,
    STATUS_NOT_TRIED,
    finish,
)
from otel_ttft.tools.replay import setup as replay_setup

MAX_TRIES = 2  # re-runs per verdict; each costs server starts


@dataclass
class Options:
    analysis: Path
    out: Path
    json_out: Path
    scenarios: tuple[str, ...]
    max_tries: int
    start_timeout: float | None
    brief: bool = False
    candidates: tuple[str, ...] = ()


def wanted(v: dict, opts: Options) -> list[dict]:
    """The verdict's candidates ``--candidate`` selects (all by default), in order."""
    picks = [c.partition("=")[::2] if "=" in c else ("", c) for c in opts.candidates]
    mine = {cid for scenario, cid in picks if scenario in ("", v["scenario"])}
    return [c for c in (v.get("change") or {}).get("candidates") or []
            if isinstance(c, dict) and (not picks or c.get("id") in mine)]


def here_has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Runner:
    """Re-runs one scenario per candidate, into the verify store."""

    def __init__(self, doc: dict, setup: dict, opts: Options, endpoint: str, store,
                 vocab: knobs.Vocabulary | None, vocab_error: str | None, out: TextIO):
        self.doc, self.setup, self.opts = doc, setup, opts
        self.endpoint, self.store, self.store_dir = endpoint, store, Path(store.directory)
        self.vocab, self.vocab_error, self.out = vocab, vocab_error, out
        self.gpu = here_has_gpu()
        self.tries = 0

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def verify(self, v: dict) -> list[dict]:
        records, tried = [], 0
        for candidate in wanted(v, self.opts):
            record = self._base(v, candidate)
            why = self._not_here(candidate)
            if why is None and tried >= self.opts.max_tries:
                why = f"limit of {self.opts.max_tries} tries per verdict reached (--max-tries)"
            if why is not None:
                record.update(status=STATUS_NOT_TRIED, reason=why,
                              summary=f"not tried here: {v['scenario']}: {record['change']}: "
                                      f"{why}")
                records.append(record)
                continue
            tried += 1
            self.tries += 1
            self._try(v, candidate, record)
            records.append(record)
            self.say(record["summary"])
            if record["verified"]:
                break
        return records

    def _base(self, v: dict, candidate: dict) -> dict:
        return {"scenario": v["scenario"], "baseline": v.get("baseline"),
                "recommendation": v.get("recommendation"), "candidate": candidate,
                "change": changes.describe(candidate), "status": STATUS_NOT_TRIED,
                "verified": False, "regressed": False, "reason": None, "run_id": None,
                "stage": candidate.get("stage") or v.get("substage") or v.get("stage"),
                "summary": ""}

    def _not_here(self, c: dict) -> str | None:
        if c.get("side") == changes.SIDE_CLIENT:
            return "a client-side change: named, not tried"
        lacks = [m for m in c.get("missing") or [] if not m.startswith("unchecked:")]
        if lacks:
            return f"the installed vLLM lacks {', '.join(lacks)}"
        if c.get("missing"):
            return ("its names were not checked against vLLM when it was analyzed (" +
                    c["missing"][0].partition(": ")[2] + "); analyze again where vLLM runs")
        if not (c.get("args") or c.get("env") or c.get("driver")
                or c.get("prepare") == changes.WARM_PREFIX):
            return "nothing the replay can change (the switch happens outside its servers)"
        if c.get("gpu_only") and not self.gpu:
            return ("needs a GPU (vLLM rejects it on CPU); scripts/gpu-check verifies it on "
                    "an NVIDIA machine")
        if self.setup["driver"] not in ("restart", "sleep") and (c.get("args") or c.get("env")):
            return (f"the servers were given by URL (driver {self.setup['driver']}): restart them"
                    " with the change and replay again")
        if self.setup["driver"] == "sleep" and not all(
                t.get("template") for t in self.setup["targets"]):
            return "the sleep driver's servers were given by URL: restart them with the change"
        if c.get("driver") == "sleep" and (c.get("sleep_level") or 1) != 1:
            return "the replay's sleep driver sleeps at level 1; level 2 is not tried"
        if c.get("driver") == "resident" and self.setup["driver"] != "restart":
            return "the resident driver is tried from the restart driver's templates only"
        if self.vocab is None and (c.get("args") or c.get("env")):
            return f"the server command cannot be edited: {self.vocab_error}"
        bad = [t["name"] for t in self.setup["targets"]
               if replay_setup.is_redacted(t.get("template"))]
        if bad:
            return (f"the recorded command of {', '.join(bad)} has redacted secrets; replay "
                    "with a template that takes them from the environment")
        return None

    # --- one try ------------------------------------------------------------------------------
    def _try(self, v: dict, c: dict, record: dict) -> None:
        k = self.tries
        run_dir = self.opts.out / f"run-{k}-{_safe(v['scenario'])}-{_safe(c['id'])}"
        env = {name: str((self.opts.out / "durable" / str(k) / name.lower()).resolve())
               for name in c.get("durable") or []}
        c_env = {**(c.get("env") or {}), **env}
        if env:
            record["change"] = changes.describe({**c, "env": c_env})
        targets = []
        for t in self.setup["targets"]:
            template = t.get("template")
            if template and t["name"] in (c.get("models") or []):
                template = knobs.edit_template(template, self.vocab, c.get("args"), c_env)
            targets.append({**t, "template": template})
        record["templates"] = {t["name"]: t["template"] for t in targets}
        self.say(f"verifying {v['scenario']}: {record['change']}")
        driver = c.get("driver") or self.setup["driver"]
        before_runs = self._runs()
        try:
            if c.get("prepare") == changes.FILL_CACHE:
                self._fill_cache(targets, c, run_dir)
            rc, error = self._replay(v["scenario"], targets, driver, run_dir,
                                     warm_prefix=c.get("prepare") == changes.WARM_PREFIX)
        except Exception as exc:  # noqa: BLE001 - a failed try is recorded, never a traceback
            rc, error = 1, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if rc == 0:
            try:
                self._measure(v, record, before_runs)
                return
            except Exception as exc:  # noqa: BLE001 - recorded, never a traceback
                rc, error = 1, (f"measuring the re-run failed: {type(exc).__name__}: "
                                f"{(str(exc).splitlines() or [''])[0]}")
        if rc != 0:
            error = _with_log_hint(error)
            record.update(status=STATUS_FAILED, reason=error or f"the replay exited {rc}",
                          summary=f"failed: {v['scenario']} with {record['change']}: "
                                  f"{error or f'the replay exited {rc}'} (logs in {run_dir})")

    def _runs(self) -> set[str]:
        from otel_ttft.tools.analysis.breakdown import collect
        from otel_ttft.tools.analysis.source import iter_traces

        if not (self.store_dir / "telemetry.db").exists():
            return set()
        return set(collect(iter_traces(self.store_dir)).runs)

    def _driver_env(self, driver: str) -> dict[str, str | None]:
        from otel_ttft.tools.replay.server import telemetry_env

        env: dict[str, str | None] = {**telemetry_env(self.endpoint),
                                      "OTEL_BSP_SCHEDULE_DELAY": "200"}
        if driver == "sleep":
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def _targets(self, targets: list[dict]):
        from otel_ttft.tools.replay.drivers import Target

        return [Target(t["name"], t.get("model") or "", t["template"], None,
                       tuple(self.setup.get("adapters") or {}) if i == 0 else (),
                       env={"OTEL_SERVICE_NAME": f"vllm-{t['name']}"})
                for i, t in enumerate(targets)]

    def _start_timeout(self) -> float:
        return self.opts.start_timeout or float(self.setup.get("start_timeout_s") or 600)

    def _fill_cache(self, targets: list[dict], c: dict, run_dir: Path) -> None:
        """One start of each changed model with the durable cache: what an earlier start of the
        deployment would have left there."""
        from otel_ttft.tools.replay.drivers import RestartDriver, closing
        from otel_ttft.tools.replay.progress import Progress

        run_dir.mkdir(parents=True, exist_ok=True)
        wanted = [t for t in self._targets(targets) if t.name in (c.get("models") or [])]
        driver = RestartDriver(wanted, Progress(), log_dir=run_dir / "prepare",
                               env=self._driver_env("restart"),
                               start_timeout_s=self._start_timeout())
        (run_dir / "prepare").mkdir(parents=True, exist_ok=True)
        with closing(driver):
            for target in wanted:
                driver.switch_to(target)  # started (filling the cache), then stopped by the next

    def _replay(self, scenario: str, targets: list[dict], driver: str, run_dir: Path, *,
                warm_prefix: bool = False) -> tuple[int, str | None]:
        """The scenario again through the replay; ``warm_prefix``: the shared prefix sent once
        after each activation, before the timed requests arrive (``replay --warm-prefix``)."""
        from otel_ttft.tools.replay import command

        s = self.setup
        a, b = targets
        resident = driver == "resident" and s["driver"] == "restart"
        argv = ["--scenarios", scenario, "--repeat", str(s["repeat"]),
                "--repeat-warm", str(s.get("repeat_warm") or s["repeat"]),
                "--concurrency", str(s["concurrency"]), "--max-tokens", str(s["max_tokens"]),
                "--seed", str(s["seed"]), "--max-model-len", str(s["max_model_len"]),
                "--otlp-endpoint", self.endpoint, "--out", str(run_dir),
                "--start-timeout", str(self._start_timeout()),
                "--request-timeout", str(s.get("request_timeout_s") or 300),
                "--name-a", a["name"], "--name-b", b["name"]]
        if s.get("tokenizer"):
            argv += ["--tokenizer", s["tokenizer"]]
        argv += ["--switch-ahead"] if s.get("switch_ahead") else []
        argv += ["--logprobs", str(s["logprobs"])] if s.get("logprobs") else []
        argv += ["--warm-prefix"] if warm_prefix or s.get("warm_prefix") else []
        adapters = s.get("adapters") or {}
        if resident:
            return self._resident(argv, targets, adapters, run_dir)
        argv += ["--driver", driver]
        for flag, t in (("a", a), ("b", b)):
            if t.get("model"):
                argv += [f"--model-{flag}", t["model"]]
            if t.get("template"):
                argv += [f"--serve-{flag}", t["template"]]
            if t.get("url"):
                argv += [f"--url-{flag}", t["url"]]
        if s.get("proxy_url"):
            argv += ["--proxy-url", s["proxy_url"]]
        for name, path in adapters.items():
            argv += ["--adapter", f"{name}={path}" if path else name]
        return _captured(command.run_argv, argv)

    def _resident(self, argv: list[str], targets: list[dict], adapters: dict, run_dir: Path
                  ) -> tuple[int, str | None]:
        """Both servers started from their templates and warmed, then the replay through the
        resident driver: nothing switches."""
        from opentelemetry import trace

        from otel_ttft.runtime.config import Config
        from otel_ttft.tools.replay import command
        from otel_ttft.tools.replay.client import ChatClient, Sampling
        from otel_ttft.tools.replay.drivers import RestartDriver, closing
        from otel_ttft.tools.replay.progress import Progress
        from otel_ttft.tools.replay.prompts import SHORT_TEXT, PromptError, build_prompts
        from otel_ttft.tools.replay.prompts import tokenizer_counter as counter

        try:  # a resident server has served its users: their shared prefix is in its cache
            chat = build_prompts(counter(self.setup["tokenizer"]), self.setup["max_model_len"],
                                 self.setup["max_tokens"]).short.messages()
        except (PromptError, KeyError, TypeError):
            chat = [{"role": "user", "content": SHORT_TEXT}]
        run_dir.mkdir(parents=True, exist_ok=True)
        wanted = self._targets(targets)
        driver = RestartDriver(wanted, Progress(), log_dir=run_dir, env=self._driver_env(
            "restart"), start_timeout_s=self._start_timeout())
        with closing(driver):
            driver.keep_resident(wanted)
            client = ChatClient(trace.NoOpTracer(), Sampling(
                max_tokens=self.setup["max_tokens"], seed=self.setup["seed"],
                logprobs=self.setup.get("logprobs") or 0))
            # A resident model has served before: untraced requests until its start's cold
            # ones are over (OTEL_TTFT_COLD_REQUESTS), so that no timed request is among them.
            warm = max(1, Config.from_env().cold_requests)
            try:
                for t in wanted:
                    for _ in range(warm):
                        client.warm(driver.url(t), t.name, chat)
            finally:
                client.close()
            argv = [*argv, "--driver", "resident", "--url-a", driver.url(wanted[0]),
                    "--url-b", driver.url(wanted[1])]
            argv += [a for name in adapters for a in ("--adapter", name)]
            return _captured(command.run_argv, argv)

    # --- measuring ----------------------------------------------------------------------------
    def _measure(self, v: dict, record: dict, before_runs: set[str]) -> None:
        from otel_ttft.tools.analysis.analyze import analyze
        from otel_ttft.tools.analysis.breakdown import collect
        from otel_ttft.tools.analysis.source import iter_traces
        from otel_ttft.tools.replay.demo import wait_quiet

        wait_quiet(self.store)
        collected = collect(iter_traces(self.store_dir))
        new_runs = sorted(set(collected.runs) - before_runs)
        if not new_runs:
            record.update(status=STATUS_FAILED, reason="the re-run's spans never arrived",
                          summary=f"failed: {v['scenario']}: the re-run's spans never arrived")
            return
        run_id = new_runs[-1]
        record["run_id"] = run_id
        new = analyze(collected, run_id=run_id, segments=False, changes=False)
        rows = [r for r in new["requests"] if r["scenario"] == v["scenario"]]
        before = [r for r in self.doc["requests"] if r["scenario"] == v["scenario"]]
        base = [r for r in self.doc["requests"] if r["scenario"] == v.get("baseline")]
        if not rows:
            errors = [e["error"] for e in new["errors"] if e["scenario"] == v["scenario"]]
            reason = errors[0] if errors else "no answered request in the re-run"
            record.update(status=STATUS_FAILED, reason=reason,
                          summary=f"failed: {v['scenario']} with {record['change']}: {reason}")
            return
        # The re-run holds the scenario alone: its prefill is split against the original
        # baseline, as the analysis split the requests before (the uncached prefix).
        finish(v, record, before, prefix.split(rows, base), base)


class _Tee(io.TextIOBase):
    """stderr as it was, keeping the replay's one-line error (``otel-ttft replay: ...``)."""

    def __init__(self, inner: TextIO):
        self.inner, self.last_error = inner, None

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith("otel-ttft replay: "):
                self.last_error = line[len("otel-ttft replay: "):]
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()


def _captured(fn, argv: list[str]) -> tuple[int, str | None]:
    tee = _Tee(sys.stderr)
    with contextlib.redirect_stderr(tee):
        rc = fn(argv)
    return rc, tee.last_error


def _with_log_hint(error: str | None) -> str | None:
    """The server's own last error line, when the replay's message names its log."""
    if not error or "(log: " not in error:
        return error
    from otel_ttft.tools.replay.server import tail

    path = error.split("(log: ", 1)[1].split(")", 1)[0]
    lines = [ln.strip() for ln in tail(Path(path), 200).splitlines() if ln.strip()]
    hint = next((ln for ln in reversed(lines) if "Error" in ln or "error:" in ln), None)
    if hint and hint not in error:
        return f"{error.split('; last lines:')[0]}; vLLM said: {hint[-300:]}"
    return error.split("; last lines:")[0]


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:40]
