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

from otel_ttft import semconv
from otel_ttft.tools import cliargs

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_OUT = "out/replay"
DEFAULT_REPEAT_WARM = 5  # a baseline of 5 measures its noise; fewer than 3 cannot


class UsageError(ValueError):
    """The command line cannot be used as given: exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option typed (``cliargs``): a bad value is a one-line exit 2 before anything runs."""
    p.add_argument("--driver", default="restart", type=cliargs.choice(semconv.DRIVERS, "driver"),
                   help="restart | sleep | resident | proxy")
    p.add_argument("--scenarios", default=",".join(semconv.SCENARIOS),
                   type=cliargs.choices_csv(semconv.SCENARIOS, "scenario"),
                   help="comma-separated, in order (default: all six)")
    p.add_argument("--repeat", default="1", type=cliargs.int_at_least(1),
                   help="runs of each switching scenario (cold-switch, switch-back: a server "
                        "start each; default 1; with --driver resident, at least --repeat-warm)")
    p.add_argument("--repeat-warm", default=str(DEFAULT_REPEAT_WARM),
                   type=cliargs.int_at_least(1),
                   help="runs of every other scenario (requests to a running server: cheap), "
                        f"the baseline's among them (default {DEFAULT_REPEAT_WARM})")
    p.add_argument("--concurrency", default="1", type=cliargs.int_at_least(1),
                   help=f"requests sent at once per step (at most {MAX_CONCURRENCY})")
    p.add_argument("--max-tokens", default="16", type=cliargs.int_at_least(1),
                   help="max_tokens every request asks for (default 16)")
    p.add_argument("--seed", default="1234", type=cliargs.int_at_least(0),
                   help="sampling seed every request sends (default 1234)")
    p.add_argument("--logprobs", default="0", type=cliargs.int_at_least(0),
                   help="top logprobs every request asks for per token, probes excepted "
                        "(default 0: none); with --switch-ahead the first request after an "
                        "activation meets what vLLM compiles on first use for them")
    p.add_argument("--max-model-len", default="512", type=cliargs.int_at_least(16),
                   help="context limit the long prompt fills (default 512, the templates' own)")
    p.add_argument("--tensor-parallel-size", default="1", type=cliargs.int_at_least(1),
                   help="workers per server (vLLM's --tensor-parallel-size), added to the "
                        "default serve templates (your own --serve-a/--serve-b say it "
                        "themselves); on a CPU build give each rank its cores, e.g. "
                        "VLLM_CPU_OMP_THREADS_BIND='0|1' (default 1)")
    p.add_argument("--model-a", type=cliargs.checkpoint,
                   help="checkpoint dir of model A (config.json + weights; default: the tiny "
                        "Llama, built)")
    p.add_argument("--model-b", type=cliargs.checkpoint,
                   help="checkpoint dir of model B (default: the tiny Qwen2, built)")
    p.add_argument("--name-a", help="served name of A (default: the checkpoint dir's name)")
    p.add_argument("--name-b", help="served name of B")
    p.add_argument("--serve-a", help="command template starting A: {model} {name} {port} "
                                     "{host} {python} {instrument}")
    p.add_argument("--serve-b", help="command template starting B")
    p.add_argument("--adapter", action="append", default=[], type=_adapter,
                   help="LoRA adapter of A for adapter-switch, NAME=PATH (or NAME with "
                        "resident/proxy); twice")
    p.add_argument("--url-a", type=cliargs.http_url, help="resident/sleep: A's running server")
    p.add_argument("--url-b", type=cliargs.http_url, help="resident/sleep: B's running server")
    p.add_argument("--proxy-url", type=cliargs.http_url, help="proxy: the router's base URL")
    p.add_argument("--tokenizer", type=cliargs.existing_dir,
                   help="tokenizer dir for prompt sizing (default: model A's)")
    p.add_argument("--otlp-endpoint", default=None, type=cliargs.http_url,
                   help="OTLP/HTTP base URL for the replay's spans and metric and the servers' "
                        f"(default $OTEL_EXPORTER_OTLP_ENDPOINT or {DEFAULT_ENDPOINT})")
    p.add_argument("--out", default=DEFAULT_OUT, type=cliargs.work_dir,
                   help="server logs go here (created if missing)")
    p.add_argument("--start-timeout", default="600", type=cliargs.seconds,
                   help="s for a server to become healthy")
    p.add_argument("--request-timeout", default="300", type=cliargs.seconds,
                   help="s for one response")
    p.add_argument("--switch-ahead", action="store_true",
                   help="activate a switching step's model before its timed requests arrive "
                        "(a router that switches ahead of its users), its cold requests "
                        "answered by probes without the shared prefix: the timed requests then "
                        "measure the prefix cache the switch emptied")
    p.add_argument("--warm-prefix", action="store_true",
                   help="after each activation, one untimed request with the shared prefix "
                        "before the timed requests arrive (what verify's prefix-warm-up tries)")


MAX_CONCURRENCY = 64


def _adapter(text: str) -> tuple[str, str | None]:
    """``NAME=PATH`` (a directory) or ``NAME`` (an adapter the running server already has)."""
    name, sep, path = text.partition("=")
    if not name or (sep and not path):
        raise argparse.ArgumentTypeError(f"wants NAME=PATH, not {text!r}")
    if path:
        cliargs.existing_dir(path)
    return name, path or None


def check_url(url: str | None, what: str, *, probe: bool = True) -> str:
    """An http(s) base URL that parses and (``probe``) whose host:port accepts a TCP connection
    right now."""
    if not url:
        raise UsageError(f"{what} is required")
    try:
        parts = cliargs.split_url(url)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{what}: {exc}") from None
    if probe:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=3).close()
        except OSError as exc:
            raise UsageError(f"{what}: cannot reach {parts.hostname}:{port} "
                             f"({exc.strerror or exc})") from None
    return url.rstrip("/")


def _adapters(raw: list[tuple[str, str | None]], need_paths: bool) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name, path in raw:
        if need_paths and not path:
            raise UsageError(f"--adapter wants NAME=PATH when the replay starts the servers, "
                             f"not {name!r}")
        found[name] = path
    return found


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except UsageError as exc:
        print(f"otel-ttft replay: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:  # noqa: C901 - one check per option, in order
    """Every argument is checked (types by argparse, then what depends on several options and
    the reachability of URLs) before anything is built, started or created."""
    from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE, TemplateError, check_template

    scenarios = args.scenarios
    if args.concurrency > MAX_CONCURRENCY:
        raise UsageError(f"--concurrency above {MAX_CONCURRENCY} is a load test, not a replay")
    if max(args.repeat, args.repeat_warm) > 1000:
        raise UsageError("--repeat and --repeat-warm above 1000 are a load test, not a replay")
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
    if not starts_servers:
        if args.driver == "resident" or args.driver == "sleep":
            args.url_a = check_url(args.url_a, "--url-a")
            args.url_b = check_url(args.url_b, "--url-b")
        else:
            args.proxy_url = check_url(args.proxy_url, "--proxy-url")
        if not (args.name_a and args.name_b):
            raise UsageError(f"--driver {args.driver} needs --name-a and --name-b (served names)")
    if "adapter-switch" in scenarios and not tiny and len(adapters) < 2:
        raise UsageError("adapter-switch needs two --adapter (or leave it out of --scenarios)")
    name_a = args.name_a or (Path(model_a).name if model_a else None)
    name_b = args.name_b or (Path(model_b).name if model_b else None)
    if name_a and name_a == name_b:
        raise UsageError("models A and B have the same served name")
    tokenizer = args.tokenizer or model_a
    if tokenizer is None and not tiny:
        raise UsageError("no local tokenizer to size the prompts: pass --tokenizer DIR")

    from otel_ttft.tools.replay.progress import Progress
    from otel_ttft.tools.replay.prompts import PromptError, build_prompts, tokenizer_counter

    progress = Progress()

    def size_prompts(path: str) -> dict:
        try:
            with progress.step("sizing the prompts with the tokenizer"):
                return build_prompts(tokenizer_counter(path), args.max_model_len,
                                     args.max_tokens)
        except PromptError as exc:
            raise UsageError(str(exc)) from None

    prompts = size_prompts(tokenizer) if tokenizer else None  # before anything is built
    if tiny or (starts_servers and model_b is None):
        from otel_ttft.tools import tiny_model

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
    if starts_servers and args.model_b is None and "cold-switch" in scenarios:
        # the shared tiny B is read by every test and demo on this host: evict our own copy
        from otel_ttft.tools.replay.evict import private_copy

        try:
            model_b = str(private_copy(model_b, Path(args.out) / "models"))
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot copy model B there: "
                             f"{exc.strerror or exc}") from None
    name_a = args.name_a or Path(model_a or "a").name
    name_b = args.name_b or Path(model_b or "b").name
    if name_a == name_b:
        raise UsageError("models A and B have the same served name")
    if prompts is None:
        prompts = size_prompts(model_a)

    from otel_ttft.tools.replay import drivers as d

    out = Path(args.out)
    template_a = args.serve_a or DEFAULT_TEMPLATE
    template_b = args.serve_b or DEFAULT_TEMPLATE
    if args.serve_a is None and adapters and starts_servers:
        template_a += (" --enable-lora --max-loras 1 --max-lora-rank 8 --lora-modules "
                       + " ".join(_template_literal(f"{n}={p}") for n, p in adapters.items()))
    if args.driver == "sleep" and starts_servers:
        template_a += "" if args.serve_a else " " + d.SLEEP_ARGS
        template_b += "" if args.serve_b else " " + d.SLEEP_ARGS
    if args.tensor_parallel_size > 1:  # several workers per server: vLLM's own flag
        tp = f" --tensor-parallel-size {args.tensor_parallel_size}"
        template_a += "" if args.serve_a else tp
        template_b += "" if args.serve_b else tp
    targets = [
        d.Target(name_a, model_a or "", template_a, args.url_a, tuple(adapters),
                 env={"OTEL_SERVICE_NAME": f"vllm-{name_a}"}),
        d.Target(name_b, model_b or "", template_b, args.url_b,
                 env={"OTEL_SERVICE_NAME": f"vllm-{name_b}"}),
    ]
    from otel_ttft.tools.replay import setup as replay_setup

    recorded = replay_setup.record(  # for `otel-ttft verify`: how to run this again
        driver=args.driver, scenarios=scenarios, repeat=args.repeat,
        repeat_warm=args.repeat_warm, concurrency=args.concurrency, max_tokens=args.max_tokens,
        seed=args.seed, logprobs=args.logprobs, max_model_len=args.max_model_len,
        tokenizer=tokenizer or model_a,
        start_timeout_s=args.start_timeout, request_timeout_s=args.request_timeout,
        targets=targets, adapters=adapters, proxy_url=args.proxy_url,
        switch_ahead=args.switch_ahead, warm_prefix=args.warm_prefix)
    return _run(args.driver, targets, progress, out, endpoint, args.start_timeout,
                args.request_timeout, prompts=prompts, scenarios=scenarios, repeat=args.repeat,
                repeat_warm=args.repeat_warm,
                concurrency=args.concurrency, max_tokens=args.max_tokens, seed=args.seed,
                logprobs=args.logprobs, proxy_url=args.proxy_url, setup=recorded,
                switch_ahead=args.switch_ahead, warm_prefix=args.warm_prefix)


def _run(driver_name: str, targets, progress, out: Path, endpoint: str, start_timeout: float,
         request_timeout: float, *, prompts, scenarios, repeat, repeat_warm, concurrency,
         max_tokens, seed, proxy_url, setup: dict | None = None, switch_ahead: bool = False,
         warm_prefix: bool = False, logprobs: int = 0) -> int:
    import httpx

    from otel_ttft.runtime.config import Config
    from otel_ttft.tools.replay import drivers as d
    from otel_ttft.tools.replay.client import Sampling, make_meter_provider, make_tracer_provider
    from otel_ttft.tools.replay.runner import FLUSH_MS, ReplayRun
    from otel_ttft.tools.replay.server import telemetry_env

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
                    concurrency, Sampling(max_tokens=max_tokens, seed=seed, logprobs=logprobs),
                    checkpoints={t.name: Path(t.model) for t in targets
                                 if t.model and Path(t.model).is_dir()},
                    progress=progress, repeat_warm=repeat_warm,
                    cold_requests=Config.from_env().cold_requests, setup=setup,
                    switch_ahead=switch_ahead, warm_prefix=warm_prefix)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    provider = make_tracer_provider(endpoint)
    meter_provider = make_meter_provider(endpoint)
    progress.line(f"replay run {run.run_id}: driver {driver.name}, scenarios "
                  + ", ".join(f"{s} x{run.repeats(s)}" for s in scenarios)
                  + f", spans to {endpoint}")
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
    parser = cliargs.Parser(prog="otel-ttft replay")
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # a usage error, said in one line
        return exc.code if isinstance(exc.code, int) else 2
    return main(args)
