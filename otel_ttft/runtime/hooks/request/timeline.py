"""One request's timestamps as stage segments that tile its server-side TTFT: pure, so the
tiling rule is tested on its own. Boundaries are shared between neighbours and clamped to be
non-decreasing, so the segments sum to the TTFT exactly."""

from __future__ import annotations

from typing import NamedTuple

from otel_ttft import semconv

SCHEDULED, PREEMPTED = "S", "P"


class Segment(NamedTuple):
    stage: str
    name: str
    start: float
    end: float


def first_scheduled(schedule: list[tuple[str, float]]) -> float | None:
    """When the request was first scheduled (``None``: not known)."""
    return next((ts for kind, ts in schedule if kind == SCHEDULED), None)


def tile(arrival: float, queued: float | None, schedule: list[tuple[str, float]],
         first_token: float | None, ttft_end: float | None, end: float) -> list[Segment]:
    """Segments from arrival to the first token handed over (or to ``end`` if none came).

    ``schedule`` holds (SCHEDULED|PREEMPTED, ts) in engine order. A preemption before the first
    token sends the request back to ``queue``; later ones are span events, not segments.
    Without any SCHEDULED time, queue and prefill cannot be told apart: one ``prefill`` segment.
    """
    limit = end
    if first_token is not None:
        limit = ttft_end if ttft_end is not None else first_token
    segs: list[Segment] = []
    cur = arrival

    def close(stage: str, name: str, t: float) -> None:
        nonlocal cur
        t = min(max(t, cur), max(limit, cur))
        segs.append(Segment(stage, name, cur, t))
        cur = t

    first_sched = first_scheduled(schedule)
    if queued is None:
        queued = first_sched if first_sched is not None else (first_token or limit)
    close(semconv.STAGE_FRONTEND, semconv.SPAN_REQUEST_INPUT, queued)
    if first_sched is None:
        stage, name = semconv.STAGE_PREFILL, semconv.SPAN_REQUEST_PREFILL
    else:
        stage, name = semconv.STAGE_QUEUE, semconv.SPAN_REQUEST_QUEUE
        for kind, ts in schedule:
            if first_token is not None and ts >= first_token:
                break
            if kind == SCHEDULED and stage == semconv.STAGE_QUEUE:
                close(stage, name, ts)
                stage, name = semconv.STAGE_PREFILL, semconv.SPAN_REQUEST_PREFILL
            elif kind == PREEMPTED and stage == semconv.STAGE_PREFILL:
                close(stage, name, ts)
                stage, name = semconv.STAGE_QUEUE, semconv.SPAN_REQUEST_QUEUE
    if first_token is None:
        close(stage, name, limit)
        return segs
    close(stage, name, first_token)
    close(semconv.STAGE_FRONTEND, semconv.SPAN_REQUEST_OUTPUT, limit)
    return segs


def stage_totals(segments: list[Segment]) -> dict[str, float]:
    """Seconds per stage (``frontend`` input and output added together)."""
    out: dict[str, float] = {}
    for seg in segments:
        out[seg.stage] = out.get(seg.stage, 0.0) + (seg.end - seg.start)
    return out


def stage_durations(arrival: float, queued: float | None, schedule: list[tuple[str, float]],
                    first_token: float, ttft_end: float | None) -> dict[str, float]:
    """``stage_totals(tile(...))`` of a request that got its first token, without building the
    segments: the common case (queued, scheduled once, first token, in that order) by
    arithmetic, anything else through ``tile``. Most requests get no span: this is all they
    need."""
    if len(schedule) == 1 and queued is not None:
        kind, scheduled = schedule[0]
        limit = ttft_end if ttft_end is not None else first_token
        if kind == SCHEDULED and arrival <= queued <= scheduled < first_token <= limit:
            return {_FRONTEND: (queued - arrival) + (limit - first_token),
                    _QUEUE: scheduled - queued, _PREFILL: first_token - scheduled}
    return stage_totals(tile(arrival, queued, schedule, first_token, ttft_end, first_token))


_FRONTEND, _QUEUE, _PREFILL = semconv.STAGE_FRONTEND, semconv.STAGE_QUEUE, semconv.STAGE_PREFILL
