"""The device check's judgement, apart from any GPU: which figures it checks, against what, with
which tolerance, and the one table it prints. Plain Python (no torch), so that tests on a CPU
machine pin the logic on synthetic numbers; ``scripts/gpu_check_bare.py`` feeds it the real
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


# A cold load's host-to-device rate must be the warm one's (the same PCIe link): the disk reads
# that fault in during the copy belong to the read stage. Same bounds as against the event copy.
COLD_WARM_H2D_RATIO = H2D_RATIO

# Our read GB/s (bytes over the reader's time) against the script's own sequential read of the
# dropped file: different access patterns (mmap faults vs read(2)), so only a gross error fails
# (the "absurd GB/s" of a read timed without its faults, or a unit error).
READ_RATIO = (0.2, 5.0)

# Our page-cache residency against mincore's, read by the script just before: the same pages
# (one shard, nothing else reading it), so a page or two of slack.
RESIDENCY_SLACK = 0.02

# A page cache that could not be dropped (tmpfs, a read-only mount) leaves no cold load to judge.
DROPPED_AT_MOST = 0.05


@dataclass(frozen=True)
class Figure:
    """One row: what our span says, what the script measured, the rule, and the verdict
    (``skipped``: the reading could not be taken here, with why in ``reference``)."""

    part: str
    name: str
    ours: Any
    reference: Any
    rule: str
    ok: bool
    unit: str = ""
    skipped: bool = False


def skip(part: str, name: str, why: str) -> Figure:
    """A figure this machine cannot judge: shown, not counted as a failure, not as a pass."""
    return Figure(part, name, None, why, "skipped", True, skipped=True)


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


def graph_figures(part: str, attrs: Mapping[str, Any], captured: Any, driver_bytes: int,
                  reserved_bytes: int, replays_match: bool, span_s: float | None,
                  wall_s: float) -> list[Figure]:
    """``Capture model`` against the capture: each mode's shapes and CUDA graphs apart, the
    total against vLLM's counter (every CUDA graph, pieces included), memory against the driver
    and the allocator, the span against the script's clock."""
    full, piecewise = (sorted(captured.sizes[m], reverse=True) for m in ("FULL", "PIECEWISE"))
    memory = attrs.get(semconv.ATTR_GRAPH_MEMORY_BYTES)
    high = reserved_bytes + max(RESERVED_ABOVE, RESERVED_ABOVE_FRACTION * reserved_bytes)
    by_mode = [attrs.get(semconv.ATTR_GRAPH_FULL_MEMORY_BYTES),
               attrs.get(semconv.ATTR_GRAPH_PIECEWISE_MEMORY_BYTES)]
    mode_sum = sum(m for m in by_mode if m is not None) if any(by_mode) else None
    reference_sum = captured.memory["FULL"] + captured.memory["PIECEWISE"]

    def listed(key: str) -> list[int] | None:
        value = attrs.get(key)
        return None if value is None else list(value)

    return [
        exact(part, "ttft.stage", attrs.get(semconv.ATTR_STAGE),
              semconv.STAGE_WARMUP_GRAPH_CAPTURE),
        exact(part, "ttft.graph.full.batch_sizes vs full graphs captured",
              listed(semconv.ATTR_GRAPH_FULL_BATCH_SIZES), full),
        exact(part, "ttft.graph.full.count", attrs.get(semconv.ATTR_GRAPH_FULL_COUNT), len(full)),
        exact(part, "ttft.graph.piecewise.batch_sizes vs piecewise captured",
              listed(semconv.ATTR_GRAPH_PIECEWISE_BATCH_SIZES), piecewise),
        exact(part, "ttft.graph.piecewise.count", attrs.get(semconv.ATTR_GRAPH_PIECEWISE_COUNT),
              len(piecewise)),
        exact(part, "ttft.graph.piecewise.pieces vs piece graphs captured",
              attrs.get(semconv.ATTR_GRAPH_PIECEWISE_PIECES), captured.graphs["PIECEWISE"]),
        exact(part, "ttft.graph.count vs every CUDA graph captured",
              attrs.get(semconv.ATTR_GRAPH_COUNT),
              captured.graphs["FULL"] + captured.graphs["PIECEWISE"]),
        between(part, "ttft.graph.memory_bytes vs driver", memory, driver_bytes,
                driver_bytes - GRAPH_READING_SLACK, driver_bytes + GRAPH_READING_SLACK, "B"),
        between(part, "ttft.graph.memory_bytes vs allocator reserved", memory, reserved_bytes,
                reserved_bytes - RESERVED_BELOW, high, "B"),
        between(part, "full + piecewise memory vs driver per mode", mode_sum, reference_sum,
                reference_sum - 2 * GRAPH_READING_SLACK, reference_sum + 2 * GRAPH_READING_SLACK,
                "B"),
        ratio(part, "Capture model span vs the script's clock", span_s, wall_s, SPAN_RATIO, "s"),
        exact(part, "graph replays match eager", replays_match, True),
    ]


# Our span around capture_model against the script's monotonic clock around the same call: the
# span opens and closes inside it (V2: ours; V1: vLLM's), so a little below, never above.
SPAN_RATIO = (0.9, 1.01)


def kv_figures(part: str, attrs: Mapping[str, Any], spans: int, backing_bytes: int,
               allocated_bytes: int | None, blocks: int, groups: int) -> list[Figure]:
    """``Allocate KV cache`` against the allocation: one backing buffer shared by ``groups``
    groups is its bytes once (vLLM >= 0.32), whatever the number of groups."""
    rows = [
        exact(part, "enriched spans (profiling call left alone)", spans, 1),
        exact(part, f"ttft.kv.bytes vs the one backing allocation ({groups} groups)",
              attrs.get(semconv.ATTR_KV_BYTES), backing_bytes, "B"),
        exact(part, "ttft.kv.blocks", attrs.get(semconv.ATTR_KV_BLOCKS), blocks),
    ]
    if allocated_bytes is None:
        rows.insert(2, skip(part, "ttft.kv.bytes vs allocator growth",
                            "no CUDA allocator here (dry run)"))
    else:
        rows.insert(2, exact(part, "ttft.kv.bytes vs allocator growth",
                             attrs.get(semconv.ATTR_KV_BYTES), allocated_bytes, "B"))
    return rows


def step_figures(part: str, label: str, choice: Mapping[str, Any] | None, ran: tuple[str, int],
                 max_piecewise: int, max_full: int) -> list[Figure]:
    """A prefill step's CUDA-graph decision (what our worker notes ship) against what the
    stand-in ran and the graphs the capture made."""
    choice = choice or {}
    return [
        exact(part, f"{label}: mode vs what ran", choice.get("mode"), ran[0]),
        exact(part, f"{label}: padded tokens vs what ran", choice.get("padded"), ran[1]),
        exact(part, f"{label}: largest piecewise graph", choice.get("max_piecewise"),
              max_piecewise),
        exact(part, f"{label}: largest full graph", choice.get("max_full"), max_full),
    ]


def sync_figures(part: str, with_hooks: str | None, without_hooks: str | None,
                 control_caught: bool) -> list[Figure]:
    """The step path under ``torch.cuda.set_sync_debug_mode("error")``: no synchronisation with
    our hooks (nor without: the stand-in's own), and the mode does catch one (a ``.item()``)."""
    return [
        exact(part, "device syncs on the step path, hooked", with_hooks or "none", "none"),
        exact(part, "device syncs on the step path, unhooked", without_hooks or "none", "none"),
        exact(part, "sync debug mode catches a .item()", control_caught, True),
    ]


def first_use_figures(part: str, notes: list[Mapping[str, Any]], again: list[Any],
                      first_launch_s: float, later_launch_s: float) -> list[Figure]:
    """A Triton kernel launched for the first time inside a step: one compile noted, named,
    inside the first launch's time and most of it; the second launch none."""
    note = notes[0] if len(notes) == 1 else {}
    seconds = note["end"] - note["start"] if note else None
    return [
        exact(part, "compiles noted in the first step", len(notes), 1),
        exact(part, "its compiler", note.get("compiler"), "triton"),
        exact(part, "its frame", note.get("frame"), "gpu_check_bare_kernels.py:scale_rows"),
        between(part, "compile s within the first launch", seconds, first_launch_s,
                0.5 * (first_launch_s - later_launch_s), first_launch_s, "s"),
        exact(part, "compiles noted in the second step", len(again), 0),
    ]


def load_figures(part: str, cold: Mapping[str, Any], warm: Mapping[str, Any], dropped: float,
                 resident_before: float | None, file_bytes: int, tensor_bytes: int,
                 disk_gb_per_s: float | None) -> list[Figure]:
    """A cold and a warm load of one safetensors file: the copy to the device at PCIe speed
    both times (the disk reads that fault in during it are the read stage's), the read stage's
    bytes, its GB/s against a plain read of the file, page-cache residency against mincore."""
    h2d = semconv.ATTR_H2D_GB_PER_S
    rows = [exact(part, "ttft.h2d.bytes (cold) vs tensor bytes", cold.get(semconv.ATTR_H2D_BYTES),
                  tensor_bytes, "B"),
            ratio(part, "ttft.h2d.gb_per_s cold vs warm (disk kept out of H2D)", cold.get(h2d),
                  warm.get(h2d), COLD_WARM_H2D_RATIO, "GB/s")]
    if dropped > DROPPED_AT_MOST:
        why = f"the page cache kept {dropped:.0%} of the file (tmpfs?): no cold read here"
        return [rows[0], skip(part, rows[1].name, why),
                skip(part, "read GB/s (cold) vs a plain read", why),
                skip(part, "page-cache residency before vs mincore", why)]
    rows.append(ratio(part, "read GB/s (cold) vs a plain read",
                      cold.get(semconv.ATTR_READ_GB_PER_S),
                      disk_gb_per_s, READ_RATIO, "GB/s"))
    resident = cold.get(semconv.ATTR_PAGE_CACHE_RESIDENT)
    rows.append(between(part, "page-cache residency before vs mincore", resident,
                        resident_before or 0.0, (resident_before or 0.0) - RESIDENCY_SLACK,
                        (resident_before or 0.0) + RESIDENCY_SLACK))
    rows.append(exact(part, "shard bytes vs the file", cold.get(semconv.ATTR_SHARD_BYTES),
                      file_bytes, "B"))
    return rows


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
    if unit == "s" and isinstance(value, (int, float)):
        return f"{value:.3f} s"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]" if value else "[]"
    return str(value)


def render(figures: Sequence[Figure], header: Mapping[str, str]) -> str:
    """The one table: a header (device, versions), then a row per figure and the verdict."""
    lines = [f"{key}: {value}" for key, value in header.items()]
    rows = [("part", "figure", "ours", "reference", "rule", "")]
    rows += [(f.part, f.name, "-" if f.skipped else _value(f.ours, f.unit),
              _value(f.reference, f.unit), f.rule,
              "skip" if f.skipped else "ok" if f.ok else "FAIL") for f in figures]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    failed = sum(not f.ok for f in figures)
    skipped = sum(f.skipped for f in figures)
    judged = len(figures) - skipped
    lines.append(f"{judged - failed}/{judged} figures ok" + (f", {failed} off" if failed else "")
                 + (f", {skipped} skipped" if skipped else ""))
    return "\n".join(lines)


def exit_code(figures: Sequence[Figure]) -> int:
    """0 when every figure is right; 1 when one is off or there are none to judge."""
    judged = [f for f in figures if not f.skipped]
    return 0 if judged and all(f.ok for f in judged) else 1
