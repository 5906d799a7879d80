"""The device check's judgement, apart from any GPU: which figures it checks, against what, with
which tolerance, and the one table it prints. Plain Python (no torch), so that tests on a CPU
machine pin the logic on synthetic numbers; ``scripts/gpu_check_torch.py`` feeds it the real
CUDA readings.

Each figure pairs what *our* span reported with an independent reading of the same thing taken
by the script (bytes it copied, a ``torch.cuda.Event``-timed copy, the caching allocator, the
driver's free memory), and says whether the two agree within the tolerance written beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_ttft import semconv

MiB = 1 << 20

# Our GB/s is the bytes over the consumer's time between yields (vLLM's param.data.copy_ plus a
# little Python per tensor); a cuda.Event pair around the same copies leaves out the host's
# launch and sync. So ours may sit a little above the event figure (event noise, a pass that ran
# faster) or below it (per-tensor overhead, small on 64 MiB tensors); half or a quarter more is
# a unit or timing defect, not noise.
H2D_RATIO = (0.5, 1.25)

# Ours is the driver's used memory (mem_get_info) around each _capture_cudagraphs call; the script
# reads the same driver figure around the whole capture_model, as vLLM's "took X GiB" log does.
# Nothing allocates between the readings but the synchronize after each call: the driver's
# allocation granularity (2 MiB) is the slack.
GRAPH_READING_SLACK = 2 * MiB

# What the caching allocator reserved during the capture (the graph pool, and the warm-up runs'
# activations beside it) is device memory, so it must be in ours (one driver page of slack
# below); above it is what the driver holds outside the allocator (instantiated graph
# executables, lazily loaded kernels): small next to the pool, bounded here.
RESERVED_BELOW = 2 * MiB
RESERVED_ABOVE = 256 * MiB
RESERVED_ABOVE_FRACTION = 0.25


@dataclass(frozen=True)
class Figure:
    """One row: what our span says, what the script measured, the rule, and the verdict."""

    part: str
    name: str
    ours: Any
    reference: Any
    rule: str
    ok: bool
    unit: str = ""


def exact(part: str, name: str, ours: Any, reference: Any, unit: str = "") -> Figure:
    return Figure(part, name, ours, reference, "equal", ours is not None and ours == reference,
                  unit)


def ratio(part: str, name: str, ours: float | None, reference: float | None,
          bounds: tuple[float, float], unit: str = "") -> Figure:
    """``ours / reference`` within ``bounds``; a missing or non-positive figure fails."""
    low, high = bounds
    ok = (ours is not None and reference is not None and reference > 0 and ours > 0
          and low <= ours / reference <= high)
    return Figure(part, name, ours, reference, f"{low:g}x..{high:g}x", ok, unit)


def between(part: str, name: str, ours: float | None, reference: float, low: float,
            high: float, unit: str = "") -> Figure:
    """``low <= ours <= high``, the bounds derived from ``reference`` by the caller."""
    rule = f"{_value(low, unit)}..{_value(high, unit)}"
    return Figure(part, name, ours, reference, rule, ours is not None and low <= ours <= high,
                  unit)


def h2d_figures(label: str, attrs: Mapping[str, Any], copied_bytes: int, event_gb_per_s: float,
                intact: bool) -> list[Figure]:
    """``Load weights`` against the copies: bytes exact, GB/s against the event-timed copy."""
    part = f"H2D {label}"
    return [
        exact(part, "ttft.h2d.bytes vs bytes copied", attrs.get(semconv.ATTR_H2D_BYTES),
              copied_bytes, "B"),
        ratio(part, "ttft.h2d.gb_per_s vs cuda.Event copy",
              attrs.get(semconv.ATTR_H2D_GB_PER_S), event_gb_per_s, H2D_RATIO, "GB/s"),
        exact(part, "parameters hold the host tensors", intact, True),
    ]


def graph_figures(attrs: Mapping[str, Any], captured_sizes: Sequence[int], device_bytes: int,
                  reserved_bytes: int, replays_match: bool) -> list[Figure]:
    """``Capture model`` against the capture: count, sizes, memory against the driver and what
    the caching allocator reserved meanwhile."""
    part = "CUDA graphs"
    sizes = attrs.get(semconv.ATTR_GRAPH_BATCH_SIZES)
    memory = attrs.get(semconv.ATTR_GRAPH_MEMORY_BYTES)
    high = reserved_bytes + max(RESERVED_ABOVE, RESERVED_ABOVE_FRACTION * reserved_bytes)
    return [
        exact(part, "ttft.stage", attrs.get(semconv.ATTR_STAGE),
              semconv.STAGE_WARMUP_GRAPH_CAPTURE),
        exact(part, "ttft.graph.count vs graphs captured", attrs.get(semconv.ATTR_GRAPH_COUNT),
              len(captured_sizes)),
        exact(part, "ttft.graph.batch_sizes vs captured", None if sizes is None else list(sizes),
              list(captured_sizes)),
        between(part, "ttft.graph.memory_bytes vs driver", memory, device_bytes,
                device_bytes - GRAPH_READING_SLACK, device_bytes + GRAPH_READING_SLACK, "B"),
        between(part, "ttft.graph.memory_bytes vs allocator reserved", memory, reserved_bytes,
                reserved_bytes - RESERVED_BELOW, high, "B"),
        exact(part, "graph replays match eager", replays_match, True),
    ]


def kv_figures(attrs: Mapping[str, Any], spans: int, config_bytes: int, allocated_bytes: int,
               blocks: int, block_size: int) -> list[Figure]:
    """``Allocate KV cache`` against the allocation: bytes against the allocator, the layout."""
    part = "KV cache"
    return [
        exact(part, "enriched spans (profiling call left alone)", spans, 1),
        exact(part, "ttft.kv.bytes vs config tensors", attrs.get(semconv.ATTR_KV_BYTES),
              config_bytes, "B"),
        exact(part, "ttft.kv.bytes vs allocator", attrs.get(semconv.ATTR_KV_BYTES),
              allocated_bytes, "B"),
        exact(part, "ttft.kv.blocks", attrs.get(semconv.ATTR_KV_BLOCKS), blocks),
        exact(part, "ttft.kv.block_size", attrs.get(semconv.ATTR_KV_BLOCK_SIZE), block_size),
        exact(part, "ttft.kv.token_capacity", attrs.get(semconv.ATTR_KV_TOKEN_CAPACITY),
              blocks * block_size),
    ]


def hook_figures(failed: Sequence[str]) -> list[Figure]:
    """A hook that raised stood aside (the failure rule): its figures are missing, this says why."""
    return [exact("hooks", "hooks that failed and stood aside", list(failed), [])]


def _value(value: Any, unit: str) -> str:
    if value is None:
        return "missing"
    if unit == "B" and isinstance(value, (int, float)):
        return f"{value / MiB:,.1f} MiB" if abs(value) >= MiB else f"{value:,.0f} B"
    if unit == "GB/s" and isinstance(value, (int, float)):
        return f"{value:.2f} GB/s"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]" if value else "[]"
    return str(value)


def render(figures: Sequence[Figure], header: Mapping[str, str]) -> str:
    """The one table: a header (device, versions), then a row per figure and the verdict."""
    lines = [f"{key}: {value}" for key, value in header.items()]
    rows = [("part", "figure", "ours", "reference", "rule", "")]
    rows += [(f.part, f.name, _value(f.ours, f.unit), _value(f.reference, f.unit), f.rule,
              "ok" if f.ok else "FAIL") for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    failed = sum(not f.ok for f in figures)
    lines.append(f"{len(figures) - failed}/{len(figures)} figures ok"
                 + (f", {failed} off" if failed else ""))
    return "\n".join(lines)


def exit_code(figures: Sequence[Figure]) -> int:
    """0 when every figure is right; 1 when one is off or there are none to judge."""
    return 0 if figures and all(f.ok for f in figures) else 1
