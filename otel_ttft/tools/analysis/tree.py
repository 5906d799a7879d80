"""A span tree as text: what a newcomer reads first to see where an activation's time went."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import SpanNode, build_trees, coverage, self_time_by_stage

# Resource attribute the plugin may set per process; ttft.process.kind on the span wins.
RESOURCE_PROCESS_KIND = "vllm.process_kind"
MAX_INDENT = 40  # tree levels drawn as indentation; deeper ones are numbered instead


def format_duration(seconds: float) -> str:
    """Milliseconds below one second, seconds above."""
    size = -seconds if seconds < 0 else seconds
    if size < 0.01:
        return f"{seconds * 1e3:.2f} ms"
    if size < 1:
        return f"{seconds * 1e3:.1f} ms"
    if size < 100:
        return f"{seconds:.2f} s"
    return f"{seconds:.0f} s"


def format_bytes(n: float) -> str:
    """Decimal units, to match GB/s."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _fmt(label: str, render: Callable[[float], str]) -> Callable[[Any], str | None]:
    def fmt(value: Any) -> str | None:
        number = _num(value)
        return None if number is None else f"{label}{render(number)}"
    return fmt


def _text(label: str, render: Callable[[Any], str] = str) -> Callable[[Any], str | None]:
    return lambda v: None if v is None or v == "" else f"{label}{render(v)}"


def _gbps(v: float) -> str:
    """GB/s, switching to MB/s below 1 GB/s so slow reads keep their digits."""
    return f"{v:.2f} GB/s" if abs(v) >= 1 else f"{v * 1e3:.3g} MB/s"


def _percent(v: float) -> str:
    return f"{v * 100:.0f}%"


def _int(v: float) -> str:
    return f"{v:.0f}"


# (attribute key, formatter) in display order: the numbers that explain a slow stage.
KEY_NUMBERS: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    (semconv.ATTR_SHARD_PATH, _text("", lambda v: os.path.basename(str(v)))),
    (semconv.ATTR_LOAD_SHARDS, _fmt("shards ", _int)),
    (semconv.ATTR_SHARD_BYTES, _fmt("", format_bytes)),
    (semconv.ATTR_LOAD_BYTES, _fmt("read ", format_bytes)),
    (semconv.ATTR_READ_GB_PER_S, _fmt("", _gbps)),
    (semconv.ATTR_LOAD_GB_PER_S, _fmt("", _gbps)),
    (semconv.ATTR_PAGE_CACHE_RESIDENT, _fmt("page cache ", _percent)),
    (semconv.ATTR_FS_TYPE, _text("fs ")),
    (semconv.ATTR_LOAD_MODEL_BYTES, _fmt("model ", format_bytes)),
    (semconv.ATTR_H2D_BYTES, _fmt("h2d ", format_bytes)),
    (semconv.ATTR_H2D_GB_PER_S, _fmt("h2d ", _gbps)),
    (semconv.ATTR_COMPILE_CACHE_HIT, _text("compile cache ", lambda v: "hit" if v else "miss")),
    (semconv.ATTR_COMPILE_GRAPHS, _fmt("compiled graphs ", _int)),
    (semconv.ATTR_GRAPH_FULL_COUNT, _fmt("full graphs ", _int)),
    (semconv.ATTR_GRAPH_PIECEWISE_COUNT, _fmt("piecewise sizes ", _int)),
    (semconv.ATTR_GRAPH_COUNT, _fmt("cuda graphs ", _int)),
    (semconv.ATTR_GRAPH_MEMORY_BYTES, _fmt("graph mem ", format_bytes)),
    (semconv.ATTR_KV_BLOCKS, _fmt("kv blocks ", _int)),
    (semconv.ATTR_KV_BYTES, _fmt("kv ", format_bytes)),
    (semconv.ATTR_HOOK_ERROR, _text("hook error: ")),
    # issue 11: what failed or is still running
    (semconv.ATTR_SPAN_UNFINISHED, lambda v: "UNFINISHED (still open at this snapshot)"
     if v is True else None),
    (semconv.ATTR_ACTIVATION_FAILED_STAGE, _text("FAILED in ")),
    (semconv.ATTR_CHILD_PID, _fmt("child pid ", _int)),
    (semconv.ATTR_CHILD_EXIT_CODE, _fmt("exit code ", _int)),
    (semconv.ATTR_CHILD_SIGNAL, _text("killed by ")),
    (semconv.ATTR_CHILD_STAGE, _text("child died in ")),
    (semconv.ATTR_SPAN_ENDED_BY, _text("ended by ")),
)


_KEY_ORDER = {key: i for i, (key, _) in enumerate(KEY_NUMBERS)}
_KEY_FORMAT = dict(KEY_NUMBERS)


def process_kind(node: SpanNode) -> str | None:
    kind = node.attributes.get(semconv.ATTR_PROCESS_KIND) or node.resource.get(
        RESOURCE_PROCESS_KIND
    )
    return str(kind) if kind else None


def describe(node: SpanNode, root_start_ns: int) -> str:
    """One line of facts about a span (without the tree prefix)."""
    # Written out for speed: ``tree`` calls this once per span of a million-span store.
    stage = node.stage
    line = f"{node.name or '(unnamed)'} [{stage}] " if stage else f"{node.name or '(unnamed)'} "
    offset = (node.start_ns - root_start_ns) / 1e9
    sign = "-" if offset < -5e-6 else "+"  # sub-rounding offsets print as +0
    line += (f"{format_duration((node.end_ns - node.start_ns) / 1e9)} "
             f"@{sign}{format_duration(abs(offset))}")
    attrs = node.attributes
    kind = attrs.get(semconv.ATTR_PROCESS_KIND) or node.resource.get(RESOURCE_PROCESS_KIND)
    if kind:
        line += f" ({kind})"
    present = [key for key in attrs if key in _KEY_ORDER] if attrs else None
    if present:
        if len(present) > 1:
            present.sort(key=_KEY_ORDER.__getitem__)
        numbers = [text for key in present if (text := _KEY_FORMAT[key](attrs[key]))]
        if numbers:
            line += "   " + ", ".join(numbers)
    return line


def _count(node: SpanNode) -> int:
    return sum(1 for _ in node.walk()) - 1


def _request_footer(request: SpanNode) -> list[str]:
    """A request span lasts until its last token; what matters is how its TTFT splits."""
    ttft = request.attributes.get(semconv.ATTR_REQUEST_TTFT)
    in_ttft: dict[str, float] = {}
    outside: dict[str, float] = {}
    for child in request.children:
        stage = child.stage or "unattributed"
        bucket = outside if stage == semconv.STAGE_FIRST_DECODE else in_ttft
        bucket[stage] = bucket.get(stage, 0.0) + child.duration_s
    parts = " + ".join(f"{stage} {format_duration(s)}" for stage, s in in_ttft.items())
    ttft_s = _num(ttft)
    head = f"server TTFT {format_duration(ttft_s)}" if ttft_s is not None else "server TTFT ?"
    lines = [f"{head} = {parts}" if parts else head]
    for stage, seconds in outside.items():
        lines.append(f"{stage} {format_duration(seconds)} (after the first token)")
    return lines


def render_tree(root: SpanNode, *, max_depth: int | None = None) -> str:
    """The tree, one span per line, then root coverage and self time per stage."""
    lines = [describe(root, root.start_ns)]
    if max_depth is not None and max_depth <= 0 and root.children:
        lines[0] += f"  (+{_count(root)} spans hidden)"
    else:  # depth first with an explicit stack: a 100,000-deep chain renders too
        stack = [(root.children, 0, "", 0)]  # (siblings, next index, prefix, depth)
        while stack:
            siblings, i, prefix, depth = stack.pop()
            if i >= len(siblings):
                continue
            stack.append((siblings, i + 1, prefix, depth))
            child, last = siblings[i], i == len(siblings) - 1
            branch = "└─ " if last else "├─ "
            if depth >= MAX_INDENT:  # deeper levels stop indenting: output stays linear
                branch += f"[depth {depth + 1}] "
            line = prefix + branch + describe(child, root.start_ns)
            if max_depth is not None and depth + 1 >= max_depth and child.children:
                lines.append(f"{line}  (+{_count(child)} spans hidden)")
                continue
            lines.append(line)
            if child.children:
                indent = prefix if depth >= MAX_INDENT else prefix + ("   " if last else "│  ")
                stack.append((child.children, 0, indent, depth + 1))
    lines.append("")
    if root.name == semconv.SPAN_REQUEST:
        lines.extend(_request_footer(root))
        return "\n".join(lines)
    lines.append(f"coverage: {coverage(root) * 100:.1f}% of {root.name!r} "
                 f"({format_duration(root.duration_s)}) is covered by its direct children")
    stages = sorted(self_time_by_stage(root).items(), key=lambda kv: (-kv[1], kv[0]))
    total = root.duration_s or 1.0
    lines.append("self time by stage:")
    width = max((len(stage) for stage, _ in stages), default=0)
    for stage, seconds in stages:
        lines.append(f"  {stage:<{width}}  {format_duration(seconds):>10}  "
                     f"{seconds / total * 100:5.1f}%")
    return "\n".join(lines)


def tree_roots(spans: list[dict]) -> tuple[list[SpanNode], list[SpanNode]]:
    """For one trace's spans: (activation then request spans, wherever they sit, each by start
    time; the trace's roots), what ``tree`` renders, in one pass over the nodes."""
    activations, requests, roots = [], [], []
    for trace_roots in build_trees(spans).values():
        roots.extend(trace_roots)
        stack = list(trace_roots)  # order does not matter: both lists are sorted below
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children)
            if node.name == semconv.SPAN_ACTIVATION:
                activations.append(node)
            elif node.name == semconv.SPAN_REQUEST:
                requests.append(node)
    def by_start(n: SpanNode) -> tuple[int, int, str]:
        return n.start_ns, -n.end_ns, n.name
    return sorted(activations, key=by_start) + sorted(requests, key=by_start), roots
