"""The GPU measurements checked on a real GPU with nothing but PyTorch: our own measurement code
(the hooks on ``Load weights``, ``Capture model`` and ``Allocate KV cache``, applied by our
registry) around real CUDA work shaped like vLLM's, each figure against an independent reading.

1. H2D: host tensors, pinned then pageable, copied into device parameters through the
   ``get_all_weights`` totals our ``Load weights`` hook keeps: bytes exact, GB/s against a
   ``torch.cuda.Event``-timed copy of the same bytes.
2. CUDA graphs: real ``torch.cuda.graph`` captures of several batch sizes, in two runtime modes,
   into one pool, through our graph-capture wrapper: count and sizes exact, memory against the
   driver's reading and the caching allocator's pool.
3. KV cache: device tensors allocated under vLLM's span, our bytes against the allocator.

Needs PyTorch with CUDA and this package's small dependencies (``scripts/gpu-wheels``), no vLLM,
no network, no receiver (spans go to an in-memory exporter). Prints one table; exit 0 when every
figure is right, 1 when one is off, 2 on bad arguments or without a CUDA device.
Run: ``scripts/gpu-check-torch`` (docs/gpu-checks.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, NoReturn

MiB = 1 << 20


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {value}")
    return value


def _sizes(text: str) -> list[int]:
    try:
        sizes = [_positive(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"batch sizes {text!r}: {exc}") from None
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"batch sizes repeat: {text!r}")
    return sorted(sizes, reverse=True)  # vLLM captures the largest first: the others reuse its pool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, no usage block
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="gpu-check-torch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--h2d-mib", type=_positive, default=1024,
                        help="bytes copied per H2D pass (pinned, then pageable); default 1024")
    parser.add_argument("--tensor-mib", type=_positive, default=64,
                        help="size of each weight tensor; default 64")
    parser.add_argument("--hidden", type=_positive, default=2048,
                        help="hidden size of the captured MLP stack; default 2048")
    parser.add_argument("--layers", type=_positive, default=4, help="its layers; default 4")
    parser.add_argument("--mixed-sizes", type=_sizes, default=_sizes("512,256,128,64"),
                        help="PIECEWISE batch sizes (tokens) to capture; default 512,256,128,64")
    parser.add_argument("--decode-sizes", type=_sizes, default=_sizes("32,16,8,4,2,1"),
                        help="FULL (uniform decode) batch sizes; default 32,16,8,4,2,1")
    parser.add_argument("--kv-blocks", type=_positive, default=2048,
                        help="KV blocks per layer (16 tokens, 64 KiB pages); default 2048")
    args = parser.parse_args(argv)
    if args.tensor_mib > args.h2d_mib:
        parser.error(f"--tensor-mib {args.tensor_mib} is above --h2d-mib {args.h2d_mib}")
    if set(args.mixed_sizes) & set(args.decode_sizes):
        parser.error("--mixed-sizes and --decode-sizes share a size (one graph per size)")
    return args


def cuda_or_reason() -> tuple[Any, str | None]:
    """(torch, None) where a CUDA device answers, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    try:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch, None
    except Exception as exc:  # noqa: BLE001 - a broken driver reads as no device
        return None, f"torch.cuda failed: {exc}"
    return None, f"torch {torch.__version__}, CUDA build {torch.version.cuda}"


def _event_gb_per_s(torch: Any, pairs: list[tuple[Any, Any]], repeats: int = 3) -> float:
    """The same copies, timed on the device by a cuda.Event pair; the median of ``repeats``."""
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for param, host in pairs:
            param.copy_(host)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        rates.append(sum(h.numel() * h.element_size() for _, h in pairs) / seconds / 1e9)
    return statistics.median(rates)


def check_h2d(torch: Any, standins: Any, exporter: Any, figures: Any, pinned: bool,
              args: argparse.Namespace) -> list:
    count = args.h2d_mib // args.tensor_mib
    numel = args.tensor_mib * MiB // 2  # bf16
    names = [f"model.layers.{i}.mlp.weight" for i in range(count)]
    host = [torch.empty(numel, dtype=torch.bfloat16, pin_memory=pinned).fill_(i % 100)
            for i in range(count)]
    params = {name: torch.empty(numel, dtype=torch.bfloat16, device="cuda") for name in names}
    params[names[0]].copy_(host[0])  # first-copy set-up (staging buffers) outside both timings
    torch.cuda.synchronize()
    exporter.clear()
    standins.DefaultModelLoader(list(zip(names, host, strict=True))).load_weights(
        standins.WeightsModel(params), model_config=None)
    spans = [s for s in exporter.get_finished_spans() if s.name == "Load weights"]
    attrs = dict(spans[-1].attributes or {}) if spans else {}
    intact = all(torch.equal(params[name], torch.full_like(params[name], i % 100))
                 for i, name in enumerate(names))
    event = _event_gb_per_s(torch, [(params[name], h) for name, h in zip(names, host, strict=True)])
    copied = sum(h.numel() * h.element_size() for h in host)
    del host, params
    torch.cuda.empty_cache()
    return figures.h2d_figures("pinned" if pinned else "pageable", attrs, copied, event, intact)


def _mlp(torch: Any, hidden: int, layers: int) -> Any:
    """A decoder-shaped stack (up, SiLU, down, residual) in bf16: GEMMs and elementwise kernels
    whose activations land in the graph pool."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [(torch.randn(4 * hidden, hidden, device="cuda", dtype=torch.bfloat16,
                            generator=gen) * 0.02,
                torch.randn(hidden, 4 * hidden, device="cuda", dtype=torch.bfloat16,
                            generator=gen) * 0.02) for _ in range(layers)]

    def forward(x: Any) -> Any:
        for up, down in weights:
            x = x + torch.nn.functional.silu(x @ up.t()) @ down.t()
        return x

    return forward


def check_graphs(torch: Any, standins: Any, exporter: Any, figures: Any, counter: Any,
                 args: argparse.Namespace) -> list:
    sizes = [*args.mixed_sizes, *args.decode_sizes]
    forward = _mlp(torch, args.hidden, args.layers)
    buffer = torch.randn(max(sizes), args.hidden, device="cuda", dtype=torch.bfloat16)
    forward(buffer)  # vLLM's profile run: the eager pool already holds the largest activations
    torch.cuda.synchronize()
    runner = standins.GPUModelRunner(forward, buffer, counter)
    plan = [(standins.CUDAGraphMode.PIECEWISE,
             [standins.BatchDescriptor(n) for n in args.mixed_sizes]),
            (standins.CUDAGraphMode.FULL,
             [standins.BatchDescriptor(n, num_reqs=n, uniform=True) for n in args.decode_sizes])]
    exporter.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_before = torch.cuda.memory_reserved()
    device_bytes = runner.capture_model(plan)
    reserved_bytes = torch.cuda.memory_reserved() - reserved_before
    spans = [s for s in exporter.get_finished_spans() if s.name == "Capture model"]
    attrs = dict(spans[-1].attributes or {}) if spans else {}
    replays_match = len(runner.graphs) == len(sizes)
    for n, (graph, output) in runner.graphs.items():
        buffer.copy_(torch.randn_like(buffer))
        graph.replay()
        replays_match = replays_match and torch.allclose(output, forward(buffer[:n]),
                                                         rtol=2e-2, atol=2e-2)
    captured = list(runner.graphs)  # in capture order
    del runner, buffer
    torch.cuda.empty_cache()
    return figures.graph_figures(attrs, captured, device_bytes, reserved_bytes, replays_match)


def check_kv(torch: Any, standins: Any, exporter: Any, figures: Any,
             args: argparse.Namespace) -> list:
    block_size, page_bytes = 16, 64 * 1024  # 16 tokens x 8 KV heads x 128 x (K, V) x bf16
    config = standins.kv_cache_config(args.layers, args.kv_blocks, block_size, page_bytes)
    runner = standins.GPUModelRunner(lambda x: x, None, standins.CompilationCounter())
    exporter.clear()
    # vLLM's profiling pass sizes the cache first, outside the span: our hook must leave it alone
    runner.initialize_kv_cache(standins.kv_cache_config(1, 1, block_size, page_bytes),
                               is_profiling=True)
    runner.kv_caches = []
    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    standins.Worker(runner).initialize_from_config(config)
    allocated = torch.cuda.memory_allocated() - allocated_before
    # a profiling call our hook did not leave alone would be a second span of that name
    spans = [s for s in exporter.get_finished_spans() if s.name == "Allocate KV cache"]
    attrs = dict(spans[-1].attributes or {}) if spans else {}
    del runner
    torch.cuda.empty_cache()
    return figures.kv_figures(attrs, len(spans), sum(t.size for t in config.kv_cache_tensors),
                              allocated, args.kv_blocks, block_size)


def _memory_exporter() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, reason = cuda_or_reason()
    if torch is None:
        print(f"gpu-check-torch: no CUDA device ({reason}); nothing to check", file=sys.stderr)
        return 2
    from scripts import gpu_check_torch_figures as figures
    from scripts import gpu_check_torch_standins as standins

    started = time.monotonic()
    exporter = _memory_exporter()
    torch.cuda.init()
    results = []
    counter = standins.CompilationCounter()
    with standins.hooked() as hook_set, standins.vllm_answers(counter, torch.cuda.is_available):
        results += check_h2d(torch, standins, exporter, figures, True, args)
        results += check_h2d(torch, standins, exporter, figures, False, args)
        results += check_graphs(torch, standins, exporter, figures, counter, args)
        results += check_kv(torch, standins, exporter, figures, args)
        results += figures.hook_figures([h.name for h in hook_set.hooks if h.failed])
    props = torch.cuda.get_device_properties(0)
    header = {"device": f"{props.name}, {props.total_memory / (1 << 30):.0f} GiB",
              "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
              "python": sys.version.split()[0],
              "ran": f"{time.monotonic() - started:.1f} s"}
    print(figures.render(results, header))
    return figures.exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
