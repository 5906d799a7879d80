"""The request span's attributes (GenAI conventions, vLLM's own when its tracing is on, the
engine at arrival, stage seconds, warm-up, content only when opted in), and the rule for a
prefill's waits for a CPU."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from otel_ttft import semconv
from otel_ttft.diagnosis import thresholds
from otel_ttft.runtime import clock
from otel_ttft.runtime.hooks import first_use
from otel_ttft.runtime.hooks.request.payload import EnginePayload, StepTime
from otel_ttft.runtime.hooks.request.state import RequestRecord
from otel_ttft.runtime.hooks.request.timeline import PREEMPTED, SCHEDULED, first_scheduled

# (SamplingParams field, attribute, the value that means "not set": then the attribute is left
# out, as the GenAI conventions ask for choice.count; each attribute costs encoding per request)
_PARAMS = (
    ("temperature", semconv.GEN_AI_REQUEST_TEMPERATURE, None),
    ("top_p", semconv.GEN_AI_REQUEST_TOP_P, 1.0),
    ("top_k", semconv.GEN_AI_REQUEST_TOP_K, 0),
    ("max_tokens", semconv.GEN_AI_REQUEST_MAX_TOKENS, None),
    ("frequency_penalty", semconv.GEN_AI_REQUEST_FREQUENCY_PENALTY, 0.0),
    ("presence_penalty", semconv.GEN_AI_REQUEST_PRESENCE_PENALTY, 0.0),
    ("seed", semconv.GEN_AI_REQUEST_SEED, None),
    ("n", semconv.GEN_AI_REQUEST_CHOICE_COUNT, 1),
)


def span_attributes(rec: RequestRecord, eng: EnginePayload | None, ttft: float | None,
                     schedule: list[tuple[str, float]], stages: dict[str, float],
                    fills: list[first_use.Fill] = ()) -> dict[str, Any]:
    """The request span's attributes: who asked for what (GenAI conventions), what the engine
    looked like at arrival, what the request paid (stage seconds, warm-up, preemptions)."""
    attrs = _attributes(rec, eng, ttft, schedule)
    if fills:
        attrs[semconv.ATTR_REQUEST_FIRST_USE_SECONDS] = _union_s(fills)
    for stage, seconds in stages.items():
        attrs[semconv.REQUEST_STAGE_SECONDS[stage]] = seconds
    seen = len(preemption_events(rec, schedule))
    attrs[semconv.ATTR_REQUEST_PREEMPTIONS] = max(seen, rec.preemptions or 0)  # vLLM's, if kept
    return attrs


def preemption_events(rec: RequestRecord, schedule: list[tuple[str, float]]
                      ) -> list[tuple[str, float, dict[str, Any]]]:
    """(name, time, attributes) of each preemption: before the first token, then after it."""
    events = [(semconv.EVENT_REQUEST_PREEMPTED, ts, {semconv.ATTR_EVENT_BEFORE_FIRST_TOKEN: True})
              for kind, ts in schedule if kind == PREEMPTED
              and (rec.first_tok is None or ts < rec.first_tok)]
    return events + [(semconv.EVENT_REQUEST_PREEMPTED, ts,
                      {semconv.ATTR_EVENT_BEFORE_FIRST_TOKEN: False})
                     for ts in rec.late_preemptions]


def _union_s(intervals: list[first_use.Fill]) -> float:
    """Seconds covered by possibly nested intervals (a compile inside a template parse)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end, _ in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


def step_evidence(steps: list[StepTime] | tuple[()]) -> dict[str, float]:
    """Wall and CPU seconds of these worker steps, and their ratio: contention's evidence."""
    wall = sum(s.wall for s in steps)
    cpu = sum(s.cpu for s in steps)
    # One thread cannot run longer than the wall: a ratio over 1 is the two clocks' granularity.
    return {semconv.ATTR_STEP_WALL_SECONDS: wall, semconv.ATTR_STEP_CPU_SECONDS: cpu,
            semconv.ATTR_STEP_CPU_RATIO: min(cpu / wall, 1.0) if wall > 0 else 1.0}


@dataclass(frozen=True, slots=True)
class Wait:
    """Time a request's prefill waited for a CPU, from ``start``, with its evidence."""

    start: float
    seconds: float
    evidence: dict[str, float]


def _overlap(lo: float, hi: float, intervals: Any) -> float:
    """Seconds of ``[lo, hi]`` the (outermost, never nested) intervals cover."""
    return sum(max(0.0, min(hi, c.end) - max(lo, c.start)) for c in intervals)


def _worker_wait(s: StepTime, previous_end: float | None, compiles: Any = ()) -> Wait | None:
    """A CPU worker step's wait: inside it, the longer of its wall against CPU time (less the
    compiles in it: a compile is the compile, not also a wait) and its run-queue delay (two
    readings of one wait); before it, the longer of its run-queue delay since its previous step
    (counted only within the gap since ``previous_end``: the request's scheduling or its
    previous step) and the hand-off from EngineCore to the worker; after it, the hand-off of its
    output back. A hand-off counts beyond ``thresholds.HANDOFF_MIN_SECONDS`` only: a worker not
    runnable at all (stopped, frozen, paged in) is on no run queue, and only the hand-off's two
    stamps show it."""
    compiled = _overlap(s.start, s.end, compiles)
    inside = max(s.wall - s.cpu - compiled, s.queued, 0.0)
    gap = max(0.0, s.start - previous_end) if previous_end is not None else 0.0
    queued_before = min(s.queued_before, gap)
    handoff_in = max(0.0, s.start - s.handed) if s.handed else 0.0
    handoff_out = max(0.0, s.received - s.end) if s.received else 0.0
    if handoff_in + handoff_out < thresholds.HANDOFF_MIN_SECONDS:
        handoff_in = handoff_out = 0.0
    before = max(queued_before, handoff_in)
    waited_s = inside + before + handoff_out
    if not thresholds.waited(s.end - s.start + before + handoff_out, waited_s):
        return None
    evidence: dict[str, Any] = {**step_evidence([s]),
                                semconv.ATTR_STEP_QUEUED_SECONDS: s.queued + queued_before}
    if s.handed:
        evidence.update({semconv.ATTR_STEP_HANDOFF_SECONDS: handoff_in + handoff_out,
                         semconv.ATTR_STEP_MAJOR_FAULTS: s.major_faults,
                         semconv.ATTR_HOST_STEAL_SECONDS: s.steal,
                         semconv.ATTR_CGROUP_THROTTLED_SECONDS: s.throttled})
    evidence[semconv.ATTR_WAIT_CAUSE] = _cause(s, waited_s, s.queued + queued_before)
    # from the wake-up (or the hand-off) it waited for, else ending with the step
    return Wait(s.start - before if before else s.end - inside, waited_s, evidence)


def _cause(s: StepTime, waited_s: float, queued_s: float) -> str:
    """What the readings say the wait was: the one that explains at least half of it, else a
    worker that was not runnable and nothing readable says why."""
    half = waited_s / 2
    for seconds, cause in ((queued_s, semconv.WAIT_CAUSE_RUN_QUEUE),
                           (s.steal, semconv.WAIT_CAUSE_STEAL),
                           (s.throttled, semconv.WAIT_CAUSE_THROTTLED)):
        if seconds >= half:
            return cause
    if s.major_faults >= thresholds.WAIT_MAJOR_FAULTS:
        return semconv.WAIT_CAUSE_MAJOR_FAULTS
    return semconv.WAIT_CAUSE_NOT_RUNNABLE


def named_waits(eng: EnginePayload | None, scheduled: float | None = None) -> list[Wait]:
    """The waits for a CPU a request's prefill had, step by step: EngineCore's run-queue wait
    over an engine step, or the waits of the CPU worker steps inside it, whichever is longer
    (two readings of one wait, never added); a worker's step outside every engine step on its
    own. ``scheduled``: when the request was scheduled. Only waits past the thresholds."""
    if eng is None or not (eng.steps or eng.engine_waits):
        return []
    worker: list[tuple[StepTime, Wait]] = []
    previous = scheduled
    for s in sorted(eng.steps, key=lambda s: s.start):
        w = _worker_wait(s, previous, eng.compile)
        if w is not None:
            worker.append((s, w))
        previous = s.end
    out: list[Wait] = []
    used: set[int] = set()
    for e in eng.engine_waits:
        inside = [i for i, (s, _) in enumerate(worker) if e.start <= s.start <= e.end]
        used.update(inside)
        mine = sum(worker[i][1].seconds for i in inside)
        queued = e.queued if thresholds.waited(e.end - e.start, e.queued) else 0.0
        if not (mine or queued):
            continue
        evidence = {semconv.ATTR_ENGINE_QUEUED_SECONDS: e.queued}
        for i in inside:
            evidence.update(worker[i][1].evidence)
        seconds = min(max(queued, mine), e.end - e.start)
        if queued >= seconds / 2:  # EngineCore's thread waited for a CPU: the worker did not
            evidence[semconv.ATTR_WAIT_CAUSE] = semconv.WAIT_CAUSE_RUN_QUEUE
        start = worker[inside[0]][1].start if mine >= queued else e.end - seconds
        out.append(Wait(start, seconds, evidence))
    out += [w for i, (_, w) in enumerate(worker) if i not in used]
    return sorted(out, key=lambda w: w.start)


_CHAT_PREFIXES = ("chatcmpl-", "resp-")  # vLLM's request ids: chat completions, responses


def operation_name(external_id: str) -> str:
    """``gen_ai.operation.name`` from vLLM's request id (``chatcmpl-...`` for chat; completions
    and offline ``generate`` are text completions)."""
    if external_id.startswith(_CHAT_PREFIXES):
        return semconv.GEN_AI_OPERATION_CHAT
    return semconv.GEN_AI_OPERATION_TEXT_COMPLETION


def _attributes(rec: RequestRecord, eng: EnginePayload | None, ttft: float | None,
                schedule: list[tuple[str, float]]) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.VLLM_REQUEST_ID: rec.ext_id,
                             semconv.GEN_AI_OPERATION_NAME: operation_name(rec.ext_id),
                             semconv.GEN_AI_PROVIDER_NAME: semconv.GEN_AI_PROVIDER_VLLM}
    if rec.vllm:
        attrs.update({k: v for k, v in rec.vllm.items() if v is not None})
    if rec.model:
        attrs[semconv.GEN_AI_REQUEST_MODEL] = rec.model
        attrs[semconv.GEN_AI_RESPONSE_MODEL] = rec.model
    if rec.prompt_len is not None:
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = rec.prompt_len
    attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = rec.out_tokens
    if rec.cached is not None:
        attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = rec.cached
    params = rec.params
    if params is not None:
        for name, key, unset in _PARAMS:
            value = getattr(params, name, None)
            if value is not None and isinstance(value, (int, float)) and value != -1 \
                    and value != unset:
                attrs[key] = value
    if rec.finish is not None:  # vLLM's ``FinishReason.STOP`` is 0: falsy
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [str(rec.finish)]
    if ttft is not None:
        attrs[semconv.ATTR_REQUEST_TTFT] = ttft
    if rec.queue is not None:  # served through a ``generate`` call
        attrs[semconv.ATTR_REQUEST_STREAMING] = rec.streaming
    if rec.aborted:
        attrs[semconv.ATTR_REQUEST_ABORTED] = True
    attrs[semconv.ATTR_REQUEST_SCHEDULE_KNOWN] = any(k == SCHEDULED for k, _ in schedule)
    if rec.rejected is not None:
        attrs[semconv.ATTR_REQUEST_REJECTED] = True
    if eng is not None:
        admitted = sum(1 for kind, ts in schedule if kind == SCHEDULED
                       and (rec.first_tok is None or ts < rec.first_tok))
        attrs[semconv.ATTR_REQUEST_ADMISSION_FAILED] = max(0, eng.attempts - admitted)
        attrs[semconv.ATTR_REQUEST_ARRIVAL_WAITING] = eng.waiting
        attrs[semconv.ATTR_REQUEST_ARRIVAL_RUNNING] = eng.running
        attrs[semconv.ATTR_REQUEST_ARRIVAL_KV_FREE] = eng.free
        attrs[semconv.ATTR_REQUEST_ARRIVAL_KV_TOTAL] = eng.total
        if eng.total:
            attrs[semconv.ATTR_REQUEST_ARRIVAL_KV_USAGE] = 1.0 - eng.free / eng.total
    if rec.lora is not None:
        attrs[semconv.ATTR_LORA_NAME] = rec.lora.lora_name
        attrs[semconv.ATTR_LORA_ID] = rec.lora.lora_int_id
        adapter = eng.adapter if eng is not None else None
        if adapter is not None:
            attrs[semconv.ATTR_LORA_LOAD_SECONDS] = adapter[1] - adapter[0]
            attrs[semconv.ATTR_ACTIVATION_KIND] = "adapter"
    if eng is not None and eng.compile:
        attrs[semconv.ATTR_REQUEST_COMPILE_SECONDS] = sum(c.end - c.start for c in eng.compile)
    if eng is not None and eng.steps:
        attrs.update(step_evidence(eng.steps))
    if eng is not None and eng.graph is not None:
        attrs.update(graph_evidence(eng.graph))
    if eng is not None and eng.engine_waits:
        attrs[semconv.ATTR_ENGINE_QUEUED_SECONDS] = sum(e.queued for e in eng.engine_waits)
    waited = sum(w.seconds for w in named_waits(eng, first_scheduled(schedule)))
    if waited:
        attrs[semconv.ATTR_REQUEST_WAIT_SECONDS] = waited
    act = rec.activation
    if act is not None:
        attrs[semconv.ATTR_REQUEST_ACTIVATION_INDEX] = rec.cold_index
        attrs.setdefault(semconv.ATTR_ACTIVATION_KIND, act.kind)
        if act.ready_ns is not None:
            attrs[semconv.ATTR_REQUEST_SINCE_READY] = (
                clock.monotonic_to_epoch_ns(rec.arrival) - act.ready_ns) / 1e9
    attrs[semconv.ATTR_REQUEST_COLD] = rec.cold
    # (both kept only with content capture opted in: ``api.ApiRequests.capture``)
    if rec.prompt is not None:
        attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": rec.prompt}]}])
    if rec.texts:
        attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": text}]}
             for _, text in sorted(rec.texts.items())])
    return attrs




def step_execution(graph: Any) -> str:
    """How the first prefill step ran: a full or a piecewise graph, or outside every graph the
    compiled model (not eager: Inductor's kernels, launched one by one) or the eager one."""
    if graph.mode == "FULL":
        return semconv.EXECUTION_FULL_GRAPH
    if graph.mode == "PIECEWISE":
        return semconv.EXECUTION_PIECEWISE_GRAPH
    return semconv.EXECUTION_COMPILED if graph.compiled else semconv.EXECUTION_EAGER


def graph_evidence(graph: Any) -> dict[str, Any]:
    """The first prefill step's CUDA-graph decision, each mode's limit apart."""
    return {semconv.ATTR_STEP_CUDAGRAPH_MODE: graph.mode,
            semconv.ATTR_STEP_CUDAGRAPH_TOKENS: graph.tokens,
            semconv.ATTR_STEP_CUDAGRAPH_PADDED_TOKENS: graph.padded or graph.tokens,
            semconv.ATTR_STEP_EXECUTION: step_execution(graph),
            semconv.ATTR_STEP_CUDAGRAPH_SOURCE: graph.source,
            semconv.ATTR_CUDAGRAPH_MAX_CAPTURED_TOKENS: graph.max_captured,
            semconv.ATTR_CUDAGRAPH_MAX_FULL_TOKENS: graph.max_full,
            semconv.ATTR_CUDAGRAPH_MAX_PIECEWISE_TOKENS: graph.max_piecewise}
