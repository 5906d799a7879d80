"""Load spans from wherever they were collected and arrange them into trees.

Inputs: a ``SpanStore`` directory, its ``spans.jsonl``, or an OTLP/JSON file as the Collector's
file exporter writes it (one export request per line, or one object). The tree functions answer
the two questions every report starts with: how much of a span its children explain
(``coverage``), and which stage each instant of an activation belongs to (``self_time_by_stage``).
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from otel_ttft import semconv
from otel_ttft.runtime import clock
from otel_ttft.tools import safe_io
from otel_ttft.tools.sink import otlp_decode
from otel_ttft.tools.sink.store import DB_FILE, SPANS_FILE, SQLITE_MAGIC, StoreFormatError
from otel_ttft.tools.sink.store_read import read_spans, read_traces

UNATTRIBUTED = "unattributed"
_VLLM_STAGES = semconv.VLLM_SPAN_STAGES
_ATTR_STAGE = semconv.ATTR_STAGE
_NS = 1e9
_OTLP_TRACE_KEYS = ("resourceSpans", "resource_spans")
_OTLP_OTHER_KEYS = ("resourceMetrics", "resource_metrics", "resourceLogs", "resource_logs")
_REQUIRED = {"trace_id": str, "span_id": str, "name": str, "start_ns": int, "end_ns": int}
_OPTIONAL = {"parent_span_id": str, "attributes": dict, "resource": dict, "events": list,
             "links": list, "status": dict, "kind": str, "scope": str}  # as a store row's
_JSON_TYPES = {dict: "object", list: "array", str: "string"}
_INT64_MAX = (1 << 63) - 1
# A cap on a JSON span file read whole (a store is streamed instead): a 1M-span export is
# well under it, /dev/zero or a mistaken disk image is not.
MAX_SPAN_FILE_BYTES = 1 << 30


class TraceFileError(ValueError):
    """Input that is missing or not spans; says which file and, when known, which line."""

    def __init__(self, path: str | Path, lineno: int | None, reason: str) -> None:
        where = f"{path}:{lineno}" if lineno else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.lineno, self.reason = Path(path), lineno, reason


# --- loading ------------------------------------------------------------------------------------
def load_spans(path: str | Path) -> list[dict]:
    """Normalized spans from a store directory or database, an earlier version's ``spans.jsonl``,
    or an OTLP/JSON file (one export request per line, or one object)."""
    db, text_file = _source(Path(path))
    spans = _load_file(text_file) if text_file else []
    return spans + (_read_db(db, read_spans) if db else [])


def iter_traces(path: str | Path, trace_id: str | None = None) -> Iterator[list[dict]]:
    """The spans of one trace per item, traces in trace-id order, for every source ``load_spans``
    reads. Analysis that looks at one trace at a time should consume this, not ``load_spans``:
    over a store database it streams through the trace-id index, so memory is bounded by the
    largest trace, not the store. ``trace_id``: only that trace (an index lookup in a store)."""
    path = Path(path)
    db, text_file = _source(path)
    if db is not None and text_file is None:
        try:
            yield from read_traces(db, trace_id)
        except StoreFormatError as exc:
            raise TraceFileError(db, None, exc.reason) from None
        return
    by_trace: dict[str, list[dict]] = {}
    for span in load_spans(path):
        if trace_id is None or span["trace_id"] == trace_id:
            by_trace.setdefault(span["trace_id"], []).append(span)
    for tid in sorted(by_trace):
        yield by_trace.pop(tid)


def _source(path: Path) -> tuple[Path | None, Path | None]:
    """(store database, JSON file) to read for ``path``, each when there is one. The input rule
    (``safe_io``): a store directory or a regular file, looked at without blocking."""
    try:
        if safe_io.input_kind(path) == "dir":
            return _store_files(path)
        if safe_io.read_header(path, len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            return path, None
    except safe_io.InputError as exc:
        raise TraceFileError(exc.path, None, exc.reason) from None
    return None, path


def _store_files(directory: Path) -> tuple[Path | None, Path | None]:
    """(database, earlier version's spans.jsonl) of a store directory, each when present."""
    found = []
    for name in (DB_FILE, SPANS_FILE):
        member = directory / name
        try:
            found.append(member if safe_io.input_kind(member) == "file" else None)
        except safe_io.InputError as exc:
            if not os.path.lexists(member):
                found.append(None)
                continue
            raise TraceFileError(exc.path, None, exc.reason) from None
    if found == [None, None]:
        raise TraceFileError(directory, None,
                             f"not a store: no {DB_FILE} (nor {SPANS_FILE}) in this directory")
    return found[0], found[1]


def _read_db(path: Path, reader: Callable[[Path], Iterable[dict]]) -> list[dict]:
    try:
        return list(reader(path))
    except StoreFormatError as exc:
        raise TraceFileError(path, None, exc.reason) from None


def _load_file(path: Path) -> list[dict]:
    try:
        data = safe_io.read_bytes(path, MAX_SPAN_FILE_BYTES, "a span file")
    except safe_io.InputError as exc:
        raise TraceFileError(exc.path, None, exc.reason) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFileError(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
                             ) from None
    spans: list[dict] = []
    for lineno, obj in _json_objects(path, text):
        spans.extend(_spans_from_object(path, lineno, obj))
    return spans


def _loads(text: str) -> Any:
    """One JSON value (NaN and Infinity, which Python's own JSON writer emits, accepted);
    nesting deeper than the parser goes (RecursionError) is a ValueError, like bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _json_objects(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """JSON lines; or the whole file as one JSON value when its first line is not one."""
    lines = text.split("\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        raise TraceFileError(path, None, "empty file")
    try:
        first = _loads(numbered[0][1])
    except ValueError:
        try:
            yield 1, _loads(text)
            return
        except json.JSONDecodeError as exc:
            raise TraceFileError(path, exc.lineno, f"not JSON ({exc.msg})") from None
        except ValueError as exc:
            raise TraceFileError(path, None, f"not JSON ({exc})") from None
    yield numbered[0][0], first
    for lineno, line in numbered[1:]:
        try:
            obj = _loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines) and not text.endswith("\n"):
                return  # a truncated last line: an interrupted write, not bad input
            raise TraceFileError(path, lineno, f"not JSON ({exc.msg})") from None
        except ValueError as exc:
            raise TraceFileError(path, lineno, f"not JSON ({exc})") from None
        yield lineno, obj


def _spans_from_object(path: Path, lineno: int, obj: Any, top: bool = True) -> list[dict]:
    if isinstance(obj, list) and top:
        return [s for item in obj for s in _spans_from_object(path, lineno, item, False)]
    if not isinstance(obj, dict):
        raise TraceFileError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    if any(k in obj for k in _OTLP_TRACE_KEYS):
        try:
            return otlp_decode.decode_trace_request(otlp_decode.trace_request_from_json(obj))
        except otlp_decode.OTLPDecodeError as exc:
            raise TraceFileError(path, lineno, str(exc)) from None
    if any(k in obj for k in _OTLP_OTHER_KEYS):
        return []  # metrics or logs in the same file: not spans
    if "span_id" in obj or "trace_id" in obj:
        for key, typ in _REQUIRED.items():
            if not isinstance(obj.get(key), typ) or isinstance(obj.get(key), bool):
                raise TraceFileError(path, lineno, f"span without a valid {key!r}")
        for key in ("start_ns", "end_ns"):
            if not 0 <= obj[key] <= _INT64_MAX:
                raise TraceFileError(path, lineno, f"span {obj['span_id']!r}: {key!r} is out "
                                     "of range for a time in ns")
        for key, typ in _OPTIONAL.items():
            if obj.get(key) is not None and not isinstance(obj[key], typ):
                raise TraceFileError(path, lineno, f"span {obj['span_id']!r}: {key!r} is not "
                                     f"a JSON {_JSON_TYPES[typ]}")
        return [obj]
    raise TraceFileError(path, lineno, "neither a span nor an OTLP/JSON trace export request")


# --- trees --------------------------------------------------------------------------------------
class SpanNode:
    """One span and its children, sorted by start time. Fields analysis reads on every visit
    are checked and converted once, here, so a malformed value cannot fail a report later."""

    __slots__ = ("span", "children", "parent", "name", "start_ns", "end_ns", "attributes",
                 "resource", "stage")

    def __init__(self, span: dict, children: list[SpanNode] | None = None,
                 parent: SpanNode | None = None) -> None:
        self.span = span
        self.children: list[SpanNode] = [] if children is None else children
        self.parent = parent
        get = span.get
        name, start, end = get("name"), get("start_ns"), get("end_ns")
        attributes, resource = get("attributes"), get("resource")
        # type() is, not isinstance: bool is no time, and this runs once per span of a million
        self.name: str = name if type(name) is str else ""
        if type(start) is not int:
            start = 0
        self.start_ns: int = start
        self.end_ns: int = end if type(end) is int and end > start else start
        if type(attributes) is not dict:
            attributes = {}
        self.attributes: dict = attributes
        self.resource: dict = resource if type(resource) is dict else {}
        stage = attributes.get(_ATTR_STAGE) if attributes else None
        # A vLLM span that opened before our plugin loaded in its process (so could not be
        # tagged) gets the stage its name stands for.
        self.stage: str | None = stage if type(stage) is str and stage else \
            _VLLM_STAGES.get(self.name)

    def __repr__(self) -> str:
        return f"SpanNode({self.name!r}, {self.span_id}, {len(self.children)} children)"

    @property
    def span_id(self) -> str:
        return self.span.get("span_id", "")

    @property
    def trace_id(self) -> str:
        return self.span.get("trace_id", "")

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / _NS

    def walk(self) -> Iterator[SpanNode]:
        """This node and every descendant, depth first, in start order."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


def build_trees(spans: Iterable[dict]) -> dict[str, list[SpanNode]]:
    """trace id -> root nodes by start time. A span whose parent is absent is a root, and so is
    every span on a parent cycle; a span exported twice counts once (the last copy wins).
    Linear apart from sorting siblings; no recursion, so any depth works."""
    by_trace: dict[str, dict[str, dict]] = {}
    for span in spans:
        tid = span["trace_id"]
        members = by_trace.get(tid)
        if members is None:
            members = by_trace[tid] = {}
        members[span["span_id"]] = span
    trees: dict[str, list[SpanNode]] = {}
    for trace_id, members in by_trace.items():
        nodes = {sid: SpanNode(span) for sid, span in members.items()}
        roots = _link(nodes, frozenset())
        if _reachable(roots) != len(nodes):  # some spans hang off a parent cycle
            for node in nodes.values():
                node.parent, node.children = None, []
            roots = _link(nodes, _cycle_members(members))
        for node in nodes.values():
            if len(node.children) > 1:
                node.children.sort(key=_order)
        roots.sort(key=_order)
        trees[trace_id] = roots
    return trees


def _link(nodes: dict[str, SpanNode], on_cycle: frozenset[str] | set[str]) -> list[SpanNode]:
    """Attach each node to its parent (unless it is on a cycle); returns the roots."""
    roots = []
    get = nodes.get
    for sid, node in nodes.items():
        parent = get(node.span.get("parent_span_id"))
        if parent is None or parent is node or (on_cycle and sid in on_cycle):
            roots.append(node)
        else:
            node.parent = parent
            parent.children.append(node)
    return roots


def _reachable(roots: list[SpanNode]) -> int:
    """How many nodes hang under these roots: every node unless some parent links form a cycle
    (a node on or under a cycle has no root above it)."""
    count, stack = 0, list(roots)
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children)
    return count


def _order(node: SpanNode) -> tuple[int, int, str]:
    return node.start_ns, -node.end_ns, node.name


def _cycle_members(members: dict[str, dict]) -> set[str]:
    """Span ids on a parent cycle. Each span has one parent, so following parents from every
    span once, and remembering where each walk went, finds every cycle in linear time."""
    state: dict[str, int] = {}  # 1: on the current walk, 2: done
    cycles: set[str] = set()
    for start in members:
        if start in state:
            continue
        path: list[str] = []
        current: str | None = start
        while current in members and current not in state:
            state[current] = 1
            path.append(current)
            current = members[current].get("parent_span_id")
        if current in state and state[current] == 1:  # the walk met itself: a cycle
            cycles.update(path[path.index(current):])
        for sid in path:
            state[sid] = 2
    return cycles


def iter_nodes(trees: dict[str, list[SpanNode]]) -> Iterator[SpanNode]:
    for roots in trees.values():
        for root in roots:
            yield from root.walk()


def find_activation_roots(spans: Iterable[dict]) -> list[SpanNode]:
    """Every ``vllm.activation`` span (with its subtree), by start time."""
    return find_named(spans, semconv.SPAN_ACTIVATION)


def find_named(spans: Iterable[dict], name: str) -> list[SpanNode]:
    """Every span called ``name`` (with its subtree) wherever it sits, by start time."""
    found = [n for n in iter_nodes(build_trees(spans)) if n.name == name]
    return sorted(found, key=_order)


def find_request_spans(spans: Iterable[dict]) -> list[SpanNode]:
    """Every request span (``llm_request``), by start time, wherever the caller's trace put it."""
    return find_named(spans, semconv.SPAN_REQUEST)


# --- time accounting ----------------------------------------------------------------------------
def coverage(node: SpanNode) -> float:
    """Fraction of the node's wall time covered by the union of its direct children, each clipped
    to the node. A zero-length node counts as fully covered."""
    length = node.end_ns - node.start_ns
    if length <= 0:
        return 1.0
    clipped = [
        (max(c.start_ns, node.start_ns), min(c.end_ns, node.end_ns)) for c in node.children
    ]
    return clock.union_ns((s, e) for s, e in clipped if e > s) / length


def staged_segments(root: SpanNode, lo: int, hi: int, default: str | None,
                    skip: frozenset[str] = frozenset()) -> list[tuple[int, int, str]]:
    """Tile ``[lo, hi]`` as ``(start, end, stage)``: each instant goes to the deepest span under
    ``root`` carrying ``ttft.stage`` (among equals the one that started last: the innermost in
    practice); uncovered instants to ``default`` (left out when None); stages in ``skip`` are
    ignored. A sweep over the span boundaries with a heap of open spans: O(n log n)."""
    if hi <= lo:
        return []
    items: list[tuple[int, int, int, int, str]] = []  # start, end, depth, start order, stage
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if node.children:
            depth1 = depth + 1
            stack.extend([(child, depth1) for child in node.children])
        stage = node.stage
        if stage and stage not in skip:
            start, end = node.start_ns, node.end_ns
            if start < lo:
                start = lo
            if end > hi:
                end = hi
            if end > start:
                items.append((start, end, depth, node.start_ns, stage))
    items.sort()
    out: list[tuple[int, int, str]] = []
    tiled, previous_end = True, lo  # every start is >= lo (clipped above)
    for item in items:
        if item[0] < previous_end:
            tiled = False
            break
        previous_end = item[1]
    if tiled:
        # Nothing nested or overlapping (a request's stage children tile it): no sweep needed.
        cursor = lo
        for start, end, _, _, stage in items:
            if start > cursor and default is not None:
                _append(out, cursor, start, default)
            _append(out, start, end, stage)
            cursor = end
        if cursor < hi and default is not None:
            _append(out, cursor, hi, default)
        return out
    bounds = sorted({lo, hi, *(i[0] for i in items), *(i[1] for i in items)})
    active: list[tuple[int, int, int, str]] = []  # (-depth, -start order, end, stage)
    k = 0
    for a, b in zip(bounds, bounds[1:], strict=False):
        while k < len(items) and items[k][0] <= a:
            _, e, depth, order, stage = items[k]
            heapq.heappush(active, (-depth, -order, e, stage))
            k += 1
        while active and active[0][2] <= a:
            heapq.heappop(active)
        stage = active[0][3] if active else default
        if stage is not None:
            _append(out, a, b, stage)
    return out


def _append(out: list[tuple[int, int, str]], start: int, end: int, stage: str) -> None:
    if out and out[-1][2] == stage and out[-1][1] == start:
        out[-1] = (out[-1][0], end, stage)
    else:
        out.append((start, end, stage))


def self_time_by_stage(root: SpanNode) -> dict[str, float]:
    """Seconds of the root's interval per stage (see ``staged_segments``); instants no stage span
    covers go to ``unattributed``."""
    result: dict[str, float] = {}
    for start, end, stage in staged_segments(root, root.start_ns, root.end_ns, UNATTRIBUTED):
        result[stage] = result.get(stage, 0.0) + (end - start) / _NS
    return result
