"""``otel-ttft replay``: arguments, checks (exit 2 with one line), targets, and the run.

Exit codes: 0 every request answered; 1 a server never became healthy, a switch or a request
failed (what was measured is still exported); 2 the command line cannot be used as given.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from otel_ttft import semconv

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_OUT = "out/replay"


class UsageError(ValueError):
    """The command line cannot be used as given: exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver", default="restart", help="restart | sleep | resident | proxy")
    p.add_argument("--scenarios", default=",".join(semconv.SCENARIOS),
                   help="comma-separated, in order (default: all six)")
    p.add_argument("--repeat", default="1", help="runs of each scenario (default 1)")
    p.add_argument("--concurrency", default="1", help="requests sent at once per step")
    p.add_argument("--max-tokens", default="16")
    p.add_argument("--seed", default="1234")
    p.add_argument("--max-model-len", default="512",
                   help="context limit the long prompt fills (default 512, the templates' own)")
    p.add_argument("--model-a", help="checkpoint of model A (default: the tiny Llama, built)")
    p.add_argument("--model-b", help="checkpoint of model B (default: the tiny Qwen2, built)")
    p.add_argument("--name-a", help="served name of A (default: the checkpoint dir's name)")
    p.add_argument("--name-b", help="served name of B")
    p.add_argument("--serve-a", help="command template starting A: {model} {name} {port} "
                                     "{host} {python} {instrument}")
    p.add_argument("--serve-b", help="command template starting B")
    p.add_argument("--adapter", action="append", default=[],
                   help="LoRA adapter of A for adapter-switch, NAME=PATH (or NAME with "
                        "resident/proxy); twice")
    p.add_argument("--url-a", help="resident/sleep: A's running server")
    p.add_argument("--url-b", help="resident/sleep: B's running server")
    p.add_argument("--proxy-url", help="proxy: the router's base URL")
    p.add_argument("--tokenizer", help="tokenizer dir for prompt sizing (default: model A's)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/HTTP base URL for the replay's spans and metric and the servers' "
                        f"(default $OTEL_EXPORTER_OTLP_ENDPOINT or {DEFAULT_ENDPOINT})")
    p.add_argument("--out", default=DEFAULT_OUT, help="server logs go here")
    p.add_argument("--start-timeout", default="600", help="s for a server to become healthy")
    p.add_argument("--request-timeout", default="300", help="s for one response")


def _int(value: str, what: str, low: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be an integer, not {value!r}") from None
    if number < low:
        raise UsageError(f"{what} must be >= {low}, not {number}")
    return number


def _float(value: str, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number, not {value!r}") from None
    if not 0 < number < 1e6:
        raise UsageError(f"{what} must be > 0 s")
    return number


def check_url(url: str | None, what: str, *, probe: bool = True) -> str:
    """An http(s) base URL whose host:port accepts a TCP connection right now."""
    if not url:
        raise UsageError(f"{what} is required")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"{what}: bad port in {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what}: not an http(s) URL: {url!r}")
    if probe:
        port = port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=3).close()
        except OSError as exc:
            raise UsageError(f"{what}: cannot reach {parts.hostname}:{port} "
                             f"({exc.strerror or exc})") from None
    return url.rstrip("/")


def _scenarios(raw: str) -> list[str]:
    names = [s.strip() for s in raw.split(",") if s.strip()]
    unknown = [s for s in names if s not in semconv.SCENARIOS]
    if unknown or not names:
        raise UsageError(f"unknown scenario {unknown[0] if unknown else raw!r}; choose from "
                         + ", ".join(semconv.SCENARIOS))
    return names


def _adapters(raw: list[str], need_paths: bool) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for item in raw:
        name, sep, path = item.partition("=")
        if not name or (need_paths and not path):
            raise UsageError(f"--adapter wants NAME=PATH, not {item!r}")
        if path and not Path(path).is_dir():
            raise UsageError(f"--adapter {name}: no directory {path!r}")
        found[name] = path or None
    return found


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except UsageError as exc:
        print(f"otel-ttft replay: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:  # noqa: C901 - one check per option, in order
    from otel_ttft.replay.drivers import DEFAULT_TEMPLATE, TemplateError, check_template

    if args.driver not in semconv.DRIVERS:
        raise UsageError(f"unknown driver {args.driver!r}; choose from "
                         + ", ".join(semconv.DRIVERS))
    scenarios = _scenarios(args.scenarios)
    repeat = _int(args.repeat, "--repeat")
    concurrency = _int(args.concurrency, "--concurrency")
    if concurrency > 64:
        raise UsageError("--concurrency above 64 is a load test, not a replay")
    max_tokens = _int(args.max_tokens, "--max-tokens")
    seed = _int(args.seed, "--seed", low=0)
    max_model_len = _int(args.max_model_len, "--max-model-len", low=16)
    start_timeout = _float(args.start_timeout, "--start-timeout")
    request_timeout = _float(args.request_timeout, "--request-timeout")
    starts_servers = args.driver == "restart" or (args.driver == "sleep" and not args.url_a)
    for template, flag in ((args.serve_a, "--serve-a"), (args.serve_b, "--serve-b")):
        if template is not None:
            try:
                check_template(template)
            except TemplateError as exc:
                raise UsageError(f"{flag}: {exc}") from None
    adapters = _adapters(args.adapter, need_paths=starts_servers)
    if "adapter-switch" in scenarios and args.adapter and len(adapters) < 2:
        raise UsageError("adapter-switch needs two --adapter")

    endpoint = check_url(args.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                         or DEFAULT_ENDPOINT, "--otlp-endpoint")
    model_a, model_b = args.model_a, args.model_b
    tiny = starts_servers and model_a is None
    if starts_servers:
        for path, flag in ((model_a, "--model-a"), (model_b, "--model-b")):
            if path is not None and not path.strip():
                raise UsageError(f"{flag} is empty")
    elif args.driver == "resident" or args.driver == "sleep":
        args.url_a = check_url(args.url_a, "--url-a")
        args.url_b = check_url(args.url_b, "--url-b")
    else:
        args.proxy_url = check_url(args.proxy_url, "--proxy-url")
    if not starts_servers and not (args.name_a and args.name_b):
        raise UsageError(f"--driver {args.driver} needs --name-a and --name-b (served names)")
    if "adapter-switch" in scenarios and not tiny and len(adapters) < 2:
        raise UsageError("adapter-switch needs two --adapter (or leave it out of --scenarios)")

    from otel_ttft.replay.progress import Progress

    progress = Progress()
    if tiny or (starts_servers and model_b is None):
        from otel_ttft import tiny_model

        try:
            with progress.step("building the tiny models (cached after the first run)"):
                model_a = model_a or str(tiny_model.ensure_tiny_model())
                model_b = model_b or str(tiny_model.ensure_tiny_model_b())
                if tiny and not adapters:
                    adapters = {k: str(v) for k, v in tiny_model.ensure_lora_adapters().items()}
        except Exception as exc:  # noqa: BLE001 - no transformers, unwritable cache, ...
            print(f"otel-ttft replay: cannot build the tiny models: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
            return 1
    name_a = args.name_a or Path(model_a or "a").name
    name_b = args.name_b or Path(model_b or "b").name
    if name_a == name_b:
        raise UsageError("models A and B have the same served name")

    tokenizer = args.tokenizer or (model_a if model_a and Path(model_a).is_dir() else None)
    if tokenizer is None:
        raise UsageError("no local tokenizer to size the prompts: pass --tokenizer DIR")

    from otel_ttft.replay import drivers as d
    from otel_ttft.replay.prompts import PromptError, build_prompts, tokenizer_counter

    try:
        with progress.step("sizing the prompts with the tokenizer"):
            prompts = build_prompts(tokenizer_counter(tokenizer), max_model_len, max_tokens)
    except PromptError as exc:
        raise UsageError(str(exc)) from None

    out = Path(args.out)
    template_a = args.serve_a or DEFAULT_TEMPLATE
    template_b = args.serve_b or DEFAULT_TEMPLATE
    if args.serve_a is None and adapters and starts_servers:
        template_a += (" --enable-lora --max-loras 1 --max-lora-rank 8 --lora-modules "
                       + " ".join(_template_literal(f"{n}={p}") for n, p in adapters.items()))
    if args.driver == "sleep" and starts_servers:
        template_a += "" if args.serve_a else " " + d.SLEEP_ARGS
        template_b += "" if args.serve_b else " " + d.SLEEP_ARGS
    targets = [
        d.Target(name_a, model_a or "", template_a, args.url_a, tuple(adapters),
                 env={"OTEL_SERVICE_NAME": f"vllm-{name_a}"}),
        d.Target(name_b, model_b or "", template_b, args.url_b,
                 env={"OTEL_SERVICE_NAME": f"vllm-{name_b}"}),
    ]
    return _run(args.driver, targets, progress, out, endpoint, start_timeout, request_timeout,
                prompts=prompts, scenarios=scenarios, repeat=repeat, concurrency=concurrency,
                max_tokens=max_tokens, seed=seed, proxy_url=args.proxy_url)


def _run(driver_name: str, targets, progress, out: Path, endpoint: str, start_timeout: float,
         request_timeout: float, *, prompts, scenarios, repeat, concurrency, max_tokens, seed,
         proxy_url) -> int:
    import httpx

    from otel_ttft.replay import drivers as d
    from otel_ttft.replay.client import Sampling, make_meter_provider, make_tracer_provider
    from otel_ttft.replay.demo import telemetry_env
    from otel_ttft.replay.runner import FLUSH_MS, ReplayRun

    env = {**telemetry_env(endpoint), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    if driver_name == "sleep":
        env["VLLM_SERVER_DEV_MODE"] = "1"
    restart = d.RestartDriver(targets, progress, log_dir=out, env=env,
                              start_timeout_s=start_timeout)
    if driver_name == "restart":
        driver: d.Driver = restart
    elif driver_name == "sleep":
        driver = d.SleepDriver(targets, progress, restart=restart)
    elif driver_name == "resident":
        driver = d.ResidentDriver(targets, progress)
    else:
        driver = d.ProxyDriver(targets, progress, proxy_url=proxy_url)
    a, b = targets
    run = ReplayRun(driver, a.name, b.name, prompts, scenarios, list(a.adapters), repeat,
                    concurrency, Sampling(max_tokens=max_tokens, seed=seed),
                    checkpoints={t.name: Path(t.model) for t in targets
                                 if t.model and Path(t.model).is_dir()},
                    progress=progress)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    provider = make_tracer_provider(endpoint)
    meter_provider = make_meter_provider(endpoint)
    progress.line(f"replay run {run.run_id}: driver {driver.name}, scenarios "
                  f"{', '.join(scenarios)} x{repeat}, spans to {endpoint}")
    try:
        with d.closing(driver):
            run.run(provider, request_timeout, meter_provider)
    except (d.ServerStartError, d.DriverError, RuntimeError, OSError, ValueError,
            httpx.HTTPError) as exc:  # a warm-up request or a switch failed: one line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"otel-ttft replay: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("otel-ttft replay: interrupted; the servers it started are stopped",
              file=sys.stderr)
        return 130
    finally:
        provider.shutdown()
        meter_provider.shutdown(timeout_millis=FLUSH_MS)
    failed = [r for r in run.records if r.result.error]
    _summary(run.records, progress)
    return 1 if failed else 0


def _summary(records, progress) -> None:
    progress.line(f"{'scenario':<15} {'#':>2} {'model':<22} {'prompt':<6} {'tokens':>6} "
                  f"{'client TTFT':>11}")
    for r in records:
        ttft = f"{r.result.ttft_s:.3f} s" if r.result.ttft_s is not None else "error"
        tokens = r.result.input_tokens if r.result.input_tokens is not None else "-"
        progress.line(f"{r.scenario:<15} {r.repeat_index:>2} {r.step.model[:22]:<22} "
                      f"{r.step.prompt:<6} {tokens:>6} {ttft:>11}")


def _template_literal(text: str) -> str:
    """``text`` as one template token: shell-quoted, braces kept literal."""
    import shlex

    return shlex.quote(text).replace("{", "{{").replace("}", "}}")


def run_argv(argv: Sequence[str]) -> int:
    """For the demo and tests: ``otel-ttft replay`` with these arguments."""
    parser = argparse.ArgumentParser(prog="otel-ttft replay")
    add_arguments(parser)
    return main(parser.parse_args(list(argv)))
