"""The GPU figures checked on a bare GPU machine (PyTorch with CUDA, nothing else: no vLLM, no
network): our real hooks, applied by our registry to stand-ins with vLLM 0.33's names and
layouts (``gpu_check_bare_v1``, ``gpu_check_bare_v2``, ``gpu_check_bare_model``), around real
CUDA work, each figure against an independent reading:

1. H2D: host tensors, pinned then pageable, into device parameters: bytes exact, GB/s against
   a ``torch.cuda.Event``-timed copy.
2. Disk and PCIe apart: a cold and a warm load of one safetensors file through vLLM's reader
   shape (memory-mapped): the copy's GB/s the same both times, the read stage's bytes and GB/s
   against a plain read, page-cache residency against ``mincore``.
3. Graph capture, V1 and V2: full and piecewise (a CUDA graph per piece) counted apart, sizes,
   CUDA graphs, memory against the driver and the allocator, the span against the clock.
4. KV cache, V1 and V2: one backing allocation shared by two groups, a profiling call first:
   bytes against the allocator's growth.
5. Serving steps on V2's dispatcher shape: each first prefill's decision against what ran; no
   device synchronisation added (``torch.cuda.set_sync_debug_mode("error")``).
6. First use: a Triton kernel compiled inside a step, named, timed inside its first launch.

``--dry-run`` runs what needs no CUDA on a CPU-only PyTorch (KV layout, page cache), every other
figure a "skip" with its reason. Exit 0 when every judged figure is right, 1 when one is off, 2
on bad arguments or without a CUDA device (and no ``--dry-run``). docs/gpu-checks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, NoReturn

from scripts import gpu_check_bare_parts as parts

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
    parser = _Parser(prog="gpu-check-bare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--h2d-mib", type=_positive, default=1024,
                        help="bytes copied per H2D pass (pinned, then pageable); default 1024")
    parser.add_argument("--tensor-mib", type=_positive, default=64,
                        help="size of each weight tensor; default 64")
    parser.add_argument("--file-mib", type=_positive, default=1536,
                        help="the safetensors file loaded cold, then warm; default 1536")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where that file is written (a disk, not tmpfs); default here")
    parser.add_argument("--hidden", type=_positive, default=2048,
                        help="hidden size of the captured stack; default 2048")
    parser.add_argument("--layers", type=_positive, default=4,
                        help="its layers (pieces of a piecewise capture); default 4")
    parser.add_argument("--sizes", type=_sizes, default=_sizes("512,256,128,64,32,16,8,4,2,1"),
                        help="capture sizes, tokens; default 512,...,1")
    parser.add_argument("--max-num-seqs", type=_positive, default=32,
                        help="full decode graphs stop here; default 32")
    parser.add_argument("--kv-blocks", type=_positive, default=4096,
                        help="KV blocks (16 tokens, 64 KiB pages per layer); default 4096")
    parser.add_argument("--dry-run", action="store_true",
                        help="without CUDA: what needs none, the rest skipped with its reason")
    args = parser.parse_args(argv)
    if args.tensor_mib > args.h2d_mib:
        parser.error(f"--tensor-mib {args.tensor_mib} is above --h2d-mib {args.h2d_mib}")
    if not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir!r} is not a directory")
    return args


def cuda_or_reason() -> tuple[Any, str | None]:
    """(torch, None) where a CUDA device answers, else (torch or None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    try:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch, None
    except Exception as exc:  # noqa: BLE001 - a broken driver reads as no device
        return torch, f"torch.cuda failed: {exc}"
    return torch, f"torch {torch.__version__}, CUDA build {torch.version.cuda}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, reason = cuda_or_reason()
    if reason is not None and (torch is None or not args.dry_run):
        print(f"gpu-check-bare: no CUDA device ({reason}); nothing to check"
              + ("" if torch is None else " (--dry-run checks what needs none)"), file=sys.stderr)
        return 2
    from scripts import gpu_check_bare_figures as figures

    started = time.monotonic()
    run = parts.Run(torch, args, parts.memory_exporter(), cuda=reason is None)
    results: list[Any] = []
    with run.hooked() as hook_sets:
        for part in parts.PARTS:
            results += part(run)
        failed = [h.name for hook_set in hook_sets for h in hook_set.hooks if h.failed]
        results += figures.hook_figures(failed)
    header = {"device": run.device_name(), "torch": f"{torch.__version__} "
              f"(CUDA {torch.version.cuda})", "python": sys.version.split()[0],
              "ran": f"{time.monotonic() - started:.1f} s"}
    if reason is not None:
        header["dry run"] = f"no CUDA ({reason}): CUDA figures skipped"
    print(figures.render(results, header))
    return figures.exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
