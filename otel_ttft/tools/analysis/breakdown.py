"""Split each request's client-observed TTFT into stages on the one clock.

A request's TTFT, as its user lived it, runs from the moment the request was made (the replay
client's ``replay.request`` span, else the server's arrival) to the first content chunk. That
interval is tiled, instant by instant, by what the traces say was happening then, most specific
first: the request's own stage spans (deepest wins, so a compile inside Prefill is
``warmup.compile``), then the activation it waited on (its stage spans, deepest wins), then an
eviction of the previous model (``switch``). Time nothing covers is ``switch`` while a switch is
under way and the new server has not started, else ``network`` (client, proxy, readiness poll).
The stages therefore sum to the client TTFT by construction.

Traces are read one at a time and reduced to small summaries, then joined: a request to the
activation it links to (``ttft.link.kind=activation``), else to one of its model that overlaps it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis import activation as activation_facts
from otel_ttft.diagnosis import ranks
from otel_ttft.tools.analysis import forecast_check
from otel_ttft.tools.analysis.traces import SpanNode, build_trees, staged_segments

_NS = 1e9
PIPELINE = semconv.TTFT_PIPELINE
Segment = tuple[int, int, str]  # start ns, end ns, stage (dotted sub-stage or family)


# --- summaries of the traces ----------------------------------------------------------------
@dataclass(slots=True)
class RunInfo:
    run_id: str
    client: Any = None
    sampling: Any = None
    concurrency: Any = None
    prompts: Any = None
    driver: Any = None
    models: Any = None
    repeat: Any = None
    repeat_warm: Any = None
    cold_requests: Any = None
    setup: Any = None  # how to run it again (ttft.replay.setup): what `verify` re-runs

    def client_settings(self) -> str:
        """What must not differ between runs that are compared."""
        return json.dumps([self.client, self.sampling, self.concurrency, self.prompts],
                          sort_keys=True, default=str)

    def as_dict(self) -> dict:
        return {"run_id": self.run_id, "client": self.client, "sampling": self.sampling,
                "concurrency": self.concurrency, "prompts": self.prompts, "driver": self.driver,
                "models": self.models, "repeat": self.repeat, "repeat_warm": self.repeat_warm,
                "cold_requests": self.cold_requests, "setup": self.setup}


@dataclass(slots=True)
class ActivationSummary:
    trace_id: str
    model: str | None
    kind: str
    start_ns: int
    end_ns: int
    segments: list[Segment]
    bytes_read: int = 0
    resident_ratio: float | None = None
    compile_cache_hit: bool | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # FACT_ATTRIBUTES: what `change` sizes
    #: with several workers: each stage's skew among their ranks, and the rank that gated it
    rank_skews: dict[str, dict] = field(default_factory=dict)
    rank_gate: dict | None = None


# Activation attributes a concrete change is computed from (change.py), shared with the live
# verdict: the largest value seen in the activation, by fact name.
FACT_ATTRIBUTES = activation_facts.FACT_ATTRIBUTES
_FACT_KEYS = {v: k for k, v in FACT_ATTRIBUTES.items()}


def _fact(facts: dict[str, Any], name: str, value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        facts[name] = max(facts.get(name, value), value)
    elif isinstance(value, str) and value and name not in facts:
        facts[name] = value
    elif isinstance(value, (list, tuple)) and value:
        facts[name] = sorted({*facts.get(name, ()), *(v for v in value
                                                     if isinstance(v, (int, float)))})


@dataclass(slots=True)
class SwitchSummary:
    start_ns: int
    end_ns: int
    stage: str
    model: str | None


@dataclass(slots=True)  # 100,000s of them: a third of the memory
class RequestSummary:
    trace_id: str
    start_ns: int  # request made (client) or arrival (server)
    client_ttft_s: float
    server_ttft_s: float | None
    arrival_ns: int | None
    segments: list[Segment]  # the server request's stage tiling
    model: str | None
    scenario: str | None
    prompt: str | None
    repeat_index: int | None
    prompt_tokens: int | None
    run_id: str | None
    activation_link: str | None
    first_after_activation: bool
    waiting_at_arrival: int | None
    compile_cache_hit: bool | None
    error: str | None = None
    activation_index: int | None = None  # its place among its server's requests (1 = first)
    evicted_resident: float | None = None  # replay: checkpoint in page cache before the switch
    evicted_cold: bool | None = None  # replay: that counted as cold
    cached_tokens: int | None = None  # prompt tokens vLLM read from its prefix cache
    forecast: dict | None = None  # replay: the forecast read just before its switch


@dataclass
class Collected:
    runs: dict[str, RunInfo] = field(default_factory=dict)
    activations: list[ActivationSummary] = field(default_factory=list)
    switches: list[SwitchSummary] = field(default_factory=list)
    requests: list[RequestSummary] = field(default_factory=list)
    spans: int = 0


def collect(traces: Iterable[list[dict]]) -> Collected:
    """One pass over the traces, keeping only what the breakdown needs."""
    out = Collected()
    for spans in traces:
        out.spans += len(spans)
        for roots in build_trees(spans).values():
            for root in roots:
                _collect_tree(root, out)
    return out


def _collect_tree(root: SpanNode, out: Collected) -> None:
    stack = [root]  # root.walk()'s order, without a generator step per span of a million
    while stack:
        node = stack.pop()
        children = node.children
        if children:
            stack.extend(reversed(children))
        name = node.name
        if name in _SUMMARIZED:
            if name == semconv.SPAN_ACTIVATION:
                out.activations.append(_activation(node))
            elif name == semconv.SPAN_REPLAY_RUN:
                run = _run(node)
                out.runs[run.run_id] = run
            elif name == semconv.SPAN_REQUEST:
                request = _request(node)
                if request is not None:
                    out.requests.append(request)
            elif not any(c.name == semconv.SPAN_REQUEST for c in node.walk()):
                out.requests.append(_unanswered(node))
        stage = node.stage
        if stage is not None and stage.startswith(semconv.STAGE_SWITCH) and \
                not _has_switch_above(node):
            out.switches.append(SwitchSummary(node.start_ns, node.end_ns, stage,
                                              _str(node.attributes.get(semconv.GEN_AI_REQUEST_MODEL))))


_SUMMARIZED = frozenset({semconv.SPAN_ACTIVATION, semconv.SPAN_REPLAY_RUN, semconv.SPAN_REQUEST,
                         semconv.SPAN_REPLAY_REQUEST})


def _has_switch_above(node: SpanNode) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.stage is not None and parent.stage.startswith(semconv.STAGE_SWITCH):
            return True
        parent = parent.parent
    return False


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


MAX_DURATION_S = 1e6  # eleven days: a TTFT or stage beyond it is a broken clock or bad data


def _seconds(value: Any) -> float | None:
    """A duration attribute: a finite number of seconds from 0 to MAX_DURATION_S, else None
    (unknown), so a hostile value can neither overflow the ns arithmetic nor give the analysis
    document a negative TTFT that ``report`` and ``check`` would refuse."""
    value = _float(value)
    return value if value is not None and 0 <= value <= MAX_DURATION_S else None


def _json_attr(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _run(node: SpanNode) -> RunInfo:
    a = node.attributes
    models = a.get(semconv.ATTR_REPLAY_MODELS)
    return RunInfo(
        run_id=_str(a.get(semconv.ATTR_REPLAY_RUN_ID)) or node.trace_id,
        client=a.get(semconv.ATTR_REPLAY_CLIENT),
        sampling=_json_attr(a.get(semconv.ATTR_REPLAY_SAMPLING)),
        concurrency=_int(a.get(semconv.ATTR_REPLAY_CONCURRENCY)),
        prompts=_json_attr(a.get(semconv.ATTR_REPLAY_PROMPTS)),
        driver=_str(a.get(semconv.ATTR_REPLAY_DRIVER)),
        models=list(models) if isinstance(models, (list, tuple)) else models,
        repeat=_int(a.get(semconv.ATTR_REPLAY_REPEAT)),
        repeat_warm=_int(a.get(semconv.ATTR_REPLAY_REPEAT_WARM)),
        cold_requests=_int(a.get(semconv.ATTR_REPLAY_COLD_REQUESTS)),
        setup=_dict(_json_attr(a.get(semconv.ATTR_REPLAY_SETUP))),
    )


def _dict(value: Any) -> dict | None:
    return value if isinstance(value, dict) else None


_MAX_SHARD_PATHS = 64


def _activation(root: SpanNode) -> ActivationSummary:
    a = root.attributes
    shard_bytes, weighted, weight, hits = 0, 0.0, 0, []
    load_bytes = 0
    facts: dict[str, Any] = {}
    ranked: list[ranks.RankedInterval] = []
    stack = [root]  # root.walk()'s order (the float sums stay bit for bit), no generator
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(reversed(node.children))
        attrs = node.attributes
        rank = _int(attrs.get(semconv.ATTR_PARALLEL_RANK))
        if rank is not None and 0 <= rank < 1 << 31 and node.stage is not None \
                and node.end_ns > node.start_ns:
            ranked.append(ranks.RankedInterval(
                node.start_ns, node.end_ns, node.stage, rank,
                wait=attrs.get(semconv.ATTR_PARALLEL_WAIT) is True))
        if node.stage == semconv.STAGE_LOAD_READ:
            size = _int(attrs.get(semconv.ATTR_SHARD_BYTES)) or 0
            shard_bytes += size
            ratio = _float(attrs.get(semconv.ATTR_PAGE_CACHE_RESIDENT))
            if ratio is not None:
                weighted += ratio * max(size, 1)
                weight += max(size, 1)
            path = _str(attrs.get(semconv.ATTR_SHARD_PATH))
            paths = facts.setdefault("shard_paths", [])
            if path and path not in paths and len(paths) < _MAX_SHARD_PATHS:
                paths.append(path)  # the exact files a page-cache warm-up reads
        load_bytes = max(load_bytes, _int(attrs.get(semconv.ATTR_LOAD_BYTES)) or 0)
        hit = attrs.get(semconv.ATTR_COMPILE_CACHE_HIT)
        if isinstance(hit, bool):
            hits.append(hit)
        for key in _FACT_KEYS.keys() & attrs.keys():
            _fact(facts, _FACT_KEYS[key], attrs[key])
    return ActivationSummary(
        trace_id=root.trace_id,
        model=_str(a.get(semconv.GEN_AI_REQUEST_MODEL)),
        kind=_str(a.get(semconv.ATTR_ACTIVATION_KIND)) or "start",
        start_ns=root.start_ns, end_ns=root.end_ns,
        segments=_segments(root, root.start_ns, root.end_ns, semconv.STAGE_WARMUP),
        bytes_read=shard_bytes or load_bytes,
        resident_ratio=weighted / weight if weight else None,
        compile_cache_hit=(all(hits) if hits else None),
        facts=facts, rank_skews=ranks.skews(ranked), rank_gate=ranks.gate(ranked),
    )


def _request(node: SpanNode) -> RequestSummary | None:
    a = node.attributes
    server_ttft = _seconds(a.get(semconv.ATTR_REQUEST_TTFT))
    client = _replay_ancestor(node)
    ca = client.attributes if client is not None else {}
    client_ttft = _seconds(ca.get(semconv.ATTR_CLIENT_TTFT))
    if server_ttft is None and client_ttft is None:
        return None  # the request never produced a token
    arrival = node.start_ns
    server_end = arrival + int((server_ttft or 0.0) * _NS)
    segments = _segments(node, arrival, server_end, semconv.STAGE_FRONTEND) \
        if server_ttft is not None else []
    if server_ttft is not None and not any(c.stage for c in node.children):
        segments = _attribute_segments(a, arrival, server_end) or segments  # issue 9: no children
    links = node.span.get("links")  # from any file: every level type-checked before use
    link = next((lk.get("trace_id") for lk in (links if isinstance(links, list) else ())
                 if isinstance(lk, dict) and isinstance(lk.get("attributes"), dict)
                 and lk["attributes"].get(semconv.ATTR_LINK_KIND)
                 == semconv.LINK_KIND_ACTIVATION), None)
    hits, stack = [], [node]  # any order: all() of them
    while stack:
        n = stack.pop()
        stack.extend(n.children)
        hit = n.attributes.get(semconv.ATTR_COMPILE_CACHE_HIT)
        if hit is True or hit is False:
            hits.append(hit)
    tokens = _int(a.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)) or _int(
        ca.get(semconv.GEN_AI_USAGE_INPUT_TOKENS))
    model = _str(ca.get(semconv.GEN_AI_REQUEST_MODEL)) or _str(
        a.get(semconv.GEN_AI_REQUEST_MODEL))
    first = (_int(a.get(semconv.ATTR_REQUEST_ACTIVATION_INDEX)) == 1
             or a.get(semconv.ATTR_REQUEST_COLD) is True  # among the server's cold requests
             or (_seconds(a.get(semconv.ATTR_REQUEST_COMPILE_SECONDS)) or 0) > 0
             or (_seconds(a.get(semconv.ATTR_REQUEST_FIRST_USE_SECONDS)) or 0) > 0
             or (_seconds(a.get(semconv.ATTR_LORA_LOAD_SECONDS)) or 0) > 0)
    evicted_cold = ca.get(semconv.ATTR_REPLAY_EVICT_COLD)
    return RequestSummary(
        trace_id=node.trace_id,
        start_ns=client.start_ns if client is not None else arrival,
        client_ttft_s=client_ttft if client_ttft is not None else server_ttft,
        server_ttft_s=server_ttft, arrival_ns=arrival, segments=segments, model=model,
        scenario=_str(ca.get(semconv.ATTR_REPLAY_SCENARIO)),
        prompt=_str(ca.get(semconv.ATTR_REPLAY_PROMPT)),
        repeat_index=_int(ca.get(semconv.ATTR_REPLAY_REPEAT_INDEX)),
        prompt_tokens=tokens,
        run_id=_str(ca.get(semconv.ATTR_REPLAY_RUN_ID)),
        activation_link=link if isinstance(link, str) else None,
        first_after_activation=first,
        waiting_at_arrival=_int(a.get(semconv.ATTR_REQUEST_ARRIVAL_WAITING)),
        compile_cache_hit=(all(hits) if hits else None),
        activation_index=_int(a.get(semconv.ATTR_REQUEST_ACTIVATION_INDEX)),
        evicted_resident=_float(ca.get(semconv.ATTR_REPLAY_EVICT_RESIDENT)),
        evicted_cold=evicted_cold if isinstance(evicted_cold, bool) else None,
        cached_tokens=_int(a.get(semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)),
        forecast=forecast_check.parse(ca.get(semconv.ATTR_REPLAY_FORECAST)),
    )


def _unanswered(node: SpanNode) -> RequestSummary:
    a = node.attributes
    return RequestSummary(
        trace_id=node.trace_id, start_ns=node.start_ns, client_ttft_s=0.0, server_ttft_s=None,
        arrival_ns=None, segments=[], model=_str(a.get(semconv.GEN_AI_REQUEST_MODEL)),
        scenario=_str(a.get(semconv.ATTR_REPLAY_SCENARIO)),
        prompt=_str(a.get(semconv.ATTR_REPLAY_PROMPT)),
        repeat_index=_int(a.get(semconv.ATTR_REPLAY_REPEAT_INDEX)), prompt_tokens=None,
        run_id=_str(a.get(semconv.ATTR_REPLAY_RUN_ID)), activation_link=None,
        first_after_activation=False, waiting_at_arrival=None, compile_cache_hit=None,
        error=_str(a.get(semconv.ATTR_REPLAY_ERROR)) or "no server-side request span",
    )


def _replay_ancestor(node: SpanNode) -> SpanNode | None:
    parent = node.parent
    while parent is not None:
        if parent.name == semconv.SPAN_REPLAY_REQUEST:
            return parent
        parent = parent.parent
    return None


# --- tiling -------------------------------------------------------------------------------------
_NOT_TTFT = frozenset({semconv.STAGE_FIRST_DECODE})


def _segments(root: SpanNode, lo: int, hi: int, default: str | None) -> list[Segment]:
    """The stage tiling of ``[lo, hi]`` under ``root``; the first decode is after any TTFT."""
    return staged_segments(root, lo, hi, default, _NOT_TTFT)


_ATTRIBUTE_STAGES = (semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL)


def _attribute_segments(a: dict, lo: int, hi: int) -> list[Segment]:
    """A request span whose stage children were not built (the request-detail policy): its
    stage durations, laid end to end in pipeline order (the totals are what the breakdown
    uses); what rounding leaves over is frontend, as for an uncovered instant."""
    out: list[Segment] = []
    cursor = lo
    # inside a stage, a sub-stage the request's attributes give: laid first (front-end cache
    # fills happen before the engine is asked; where in Prefill its wait fell is not known)
    inner = {semconv.STAGE_FRONTEND: (semconv.STAGE_WARMUP_FIRST_USE,
                                      _float(a.get(semconv.ATTR_REQUEST_FIRST_USE_SECONDS))),
             semconv.STAGE_PREFILL: (semconv.STAGE_PREFILL_WAIT,
                                     _float(a.get(semconv.ATTR_REQUEST_WAIT_SECONDS)))}
    for stage in _ATTRIBUTE_STAGES:
        seconds = _seconds(a.get(semconv.REQUEST_STAGE_SECONDS[stage]))
        sub, sub_seconds = inner.get(stage, (None, None))
        if sub and seconds and sub_seconds and 0 < sub_seconds <= seconds:
            end = min(hi, cursor + int(sub_seconds * _NS))
            if end > cursor:
                _append(out, cursor, end, sub)
                cursor = end
            seconds -= sub_seconds
        end = min(hi, cursor + int(seconds * _NS)) if seconds and seconds > 0 else cursor
        if end > cursor:
            _append(out, cursor, end, stage)
            cursor = end
    if out and cursor < hi:
        _append(out, cursor, hi, semconv.STAGE_FRONTEND)
    return out


def _append(out: list[Segment], start: int, end: int, stage: str) -> None:
    if out and out[-1][2] == stage and out[-1][1] == start:
        out[-1] = (out[-1][0], end, stage)
    else:
        out.append((start, end, stage))


def tile_request(request: RequestSummary, activation: ActivationSummary | None,
                 switches: list[SwitchSummary]) -> list[Segment]:
    """The client's interval, tiled by request, then activation, then switch; gaps named."""
    lo = request.start_ns
    hi = lo + int(request.client_ttft_s * _NS)
    own = request.segments
    if activation is None and not switches and own and own[0][0] == lo and own[-1][1] == hi:
        # The server's own tiling (gaps already named) is the whole interval: nothing to layer.
        return list(own)
    layers: list[list[Segment]] = [own]  # tilings: sorted, non-overlapping
    if activation is not None:
        layers.append(activation.segments)
    evictions = [(s.start_ns, s.end_ns, s.stage) for s in switches]  # may overlap each other
    starts = [x for x in (activation.start_ns if activation is not None else None,
                          request.arrival_ns) if x is not None]
    server_start = min(starts) if starts else hi
    switch_began = min((s.start_ns for s in switches), default=None)
    bounds = {lo, hi, server_start}
    for layer in (*layers, evictions):
        for s, e, _ in layer:
            bounds.update(x for x in (s, e) if lo < x < hi)
    ordered = [x for x in sorted(bounds) if lo <= x <= hi]
    cursors = [0] * len(layers)
    out: list[Segment] = []
    for a, b in zip(ordered, ordered[1:], strict=False):
        stage = None
        for i, layer in enumerate(layers):
            j = cursors[i]
            while j < len(layer) and layer[j][1] <= a:
                j += 1
            cursors[i] = j
            if j < len(layer) and layer[j][0] <= a and layer[j][1] >= b:
                stage = layer[j][2]
                break
        if stage is None:
            stage = next((st for s, e, st in evictions if s <= a and e >= b), None)
        if stage is None:
            under_switch = switch_began is not None and switch_began <= a and b <= server_start
            stage = semconv.STAGE_SWITCH if under_switch else semconv.STAGE_NETWORK
        _append(out, a, b, stage)
    return out


def join_activation(request: RequestSummary, activations: list[ActivationSummary]
                    ) -> ActivationSummary | None:
    """The activation this request waited on: its link, else one of its model overlapping the
    request's interval; only when the two overlap (otherwise the model was already resident)."""
    lo = request.start_ns
    hi = lo + int(request.client_ttft_s * _NS)
    overlapping = [a for a in activations if a.start_ns < hi and a.end_ns > lo]
    linked = [a for a in overlapping if a.trace_id == request.activation_link]
    if linked:
        return linked[0]
    same_model = [a for a in overlapping if request.model is None or a.model in (None,
                                                                                 request.model)]
    return max(same_model, key=lambda a: a.start_ns) if same_model else None


def join_switches(request: RequestSummary, switches: list[SwitchSummary]) -> list[SwitchSummary]:
    lo = request.start_ns
    hi = lo + int(request.client_ttft_s * _NS)
    return sorted((s for s in switches if s.start_ns < hi and s.end_ns > lo),
                  key=lambda s: s.start_ns)
