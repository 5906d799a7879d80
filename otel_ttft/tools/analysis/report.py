"""``otel-ttft report``: one self-contained HTML page from an analysis.json.

Geometry (inline SVG) is computed here; ``templates/report.html.j2`` lays it out with Jinja2's
autoescaping on, so every string from the (untrusted) input is escaped in one place. The page
loads nothing: its CSP forbids every fetch, styles are inline, there is no script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import jinja2

from otel_ttft import semconv
from otel_ttft.tools import safe_io
from otel_ttft.tools.analysis import forecast_check
from otel_ttft.tools.analysis import report_format as fmt
from otel_ttft.tools.analysis.change import change_lines
from otel_ttft.tools.analysis.contract import PIPELINE, Analysis, Request, Segment, Verdict
from otel_ttft.tools.analysis.report_format import fmt_s
from otel_ttft.version import __version__

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
FAMILY_COLOURS = {
    semconv.STAGE_SWITCH: "#CC79A7", semconv.STAGE_LOAD: "#E69F00",
    semconv.STAGE_WARMUP: "#D55E00", semconv.STAGE_FRONTEND: "#009E73",
    semconv.STAGE_QUEUE: "#F0E442", semconv.STAGE_PREFILL: "#0072B2",
    semconv.STAGE_NETWORK: "#56B4E9", semconv.STAGE_FIRST_DECODE: "#999999",
}
OTHER_COLOUR = "#777777"
NONE_COLOUR = "#9aa3ad"
DARK_TEXT_ON = {semconv.STAGE_QUEUE, semconv.STAGE_NETWORK, semconv.STAGE_LOAD,
                semconv.STAGE_SWITCH, semconv.STAGE_FIRST_DECODE}

RECOMMENDATIONS = {
    "keep-resident": "Keep the model resident, or route requests by which model is in memory: "
                     "the first token waited for a switch, a weight load or a process start.",
    "persist-artifacts": "Persist compile and graph-capture artifacts between starts (a shared "
                         "compile cache), so the first request does not rebuild them.",
    "tune-admission": "Tune admission: concurrency limits and the KV-cache budget; the request "
                      "waited in the scheduler queue.",
    "tune-context": "Tune the context: shorter prompts, prefix caching or chunked prefill; "
                    "prefill grows with prompt tokens.",
    "warm-up": "Warm up after activation, before users are routed to the new model: a few "
               "requests through the chat template and tokenizer, and one with the shared "
               "prompt prefix where the switch emptied vLLM's prefix cache.",
    "none": "No stage expanded materially against the baseline.",
}
OUTCOMES = {
    "within-noise": "no slower than the baseline beyond noise: nothing to change",
    "undetermined": "cannot tell: the baseline has too few requests to measure its noise",
}
OUTSIDE_WARMUP = ("Nothing to change in the model's warm-up: the stage that grew is outside it "
                  "(server front-end, client or network).")

WIDTH = 1000  # SVG user units; the SVG scales to the page width
LABEL_W = 210
RIGHT_PAD = 110
ROW_H = 22
MAX_ROWS = 60  # waterfall rows drawn per request
MAX_STRIP = 2000  # rects in the one-line timeline


class ReportError(Exception):
    """The report could not be written; one line."""


def colour(family: str) -> str:
    return FAMILY_COLOURS.get(family, OTHER_COLOUR)


def text_colour(family: str) -> str:
    return "#111" if family in DARK_TEXT_ON or family not in FAMILY_COLOURS else "#fff"


def short(text: str, n: int = 30) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    title: str
    label: str = ""
    label_fill: str = "#111"
    family: str = ""


@dataclass
class Waterfall:
    scenario: str
    request: Request
    target_s: float
    n: int
    height: float
    strip: list[Rect] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    ttft_x: float = 0.0
    axis_y: float = 0.0
    hidden: int = 0
    ttft: str = ""
    median: str = ""
    evidence: list[tuple[str, str]] = field(default_factory=list)


def _merge(segments: list[Segment]) -> list[Segment]:
    """Adjacent segments of one substage become one (e.g. many decode steps)."""
    out: list[Segment] = []
    for seg in sorted(segments, key=lambda s: s.start_s):
        prev = out[-1] if out else None
        if (prev and prev.stage == seg.stage and prev.substage == seg.substage
                and abs(prev.start_s + prev.duration_s - seg.start_s) < 1e-6):
            out[-1] = prev.model_copy(update={"duration_s": prev.duration_s + seg.duration_s})
        else:
            out.append(seg)
    return out


def representative(requests: list[Request], target_s: float) -> Request:
    """The request whose client TTFT is closest to the scenario's median."""
    return min(requests, key=lambda r: abs(r.client_ttft_s - target_s))


def _evidence_rows(req: Request) -> list[tuple[str, str]]:
    ev = req.evidence
    rows = [("trace", req.trace_id), ("model", req.model),
            ("client TTFT", fmt_s(req.client_ttft_s))]
    if req.server_ttft_s is not None:
        rows.append(("server TTFT", fmt_s(req.server_ttft_s)))
    if req.prompt is not None or req.prompt_tokens is not None:
        tokens = "?" if req.prompt_tokens is None else str(req.prompt_tokens)
        rows.append(("prompt", f"{req.prompt or ''} ({tokens} tokens)".strip()))
    if ev.bytes_read is not None:
        rows.append(("checkpoint read", fmt.fmt_bytes(ev.bytes_read)))
        read_s = req.substages.get(semconv.STAGE_LOAD_READ, 0.0)
        if ev.bytes_read and read_s > 0:
            rows.append(("read throughput", fmt.fmt_value("gb_per_s",
                                                          ev.bytes_read / read_s / 1e9)))
    if ev.page_cache_resident_ratio is not None:
        rows.append(("in page cache at read", f"{ev.page_cache_resident_ratio:.0%}"))
    extra = ev.model_extra or {}
    before = extra.get("evicted_resident_ratio")
    if isinstance(before, (int, float)) and not isinstance(before, bool):
        rows.append(("in page cache before the switch", f"{before:.0%}"))
    if ev.compile_cache_hit is not None:
        rows.append(("compile cache hit", "yes" if ev.compile_cache_hit else "no"))
    if ev.model_was_resident is not None:
        rows.append(("model was resident", "yes" if ev.model_was_resident else "no"))
    index = extra.get("activation_index")
    if isinstance(index, int) and not isinstance(index, bool):
        rows.append(("request after its server's activation", f"#{index}"))
    rows.append(("activation trace", req.activation_trace_id or "none"))
    return rows


def _lanes(segs: list[Segment]) -> dict[str, list[Segment]]:
    """One lane per (sub)stage, in the order each first appears: all of its segments on it."""
    lanes: dict[str, list[Segment]] = {}
    for seg in segs:
        lanes.setdefault(seg.label, []).append(seg)
    return lanes


def build_waterfall(scenario: str, requests: list[Request], target_s: float) -> Waterfall:
    req = representative(requests, target_s)
    segs = _merge(list(req.segments))
    lo = min([0.0] + [s.start_s for s in segs])
    hi = max([req.client_ttft_s] + [s.start_s + s.duration_s for s in segs])
    hi = hi if hi > lo else lo + 1.0
    plot_w = WIDTH - LABEL_W - RIGHT_PAD
    x = lambda t: LABEL_W + (t - lo) / (hi - lo) * plot_w

    wf = Waterfall(scenario, req, target_s, len(requests), 0.0)
    wf.evidence = _evidence_rows(req)
    wf.ttft, wf.median = fmt_s(req.client_ttft_s), fmt_s(target_s)
    for s in _longest(segs, MAX_STRIP):
        x0 = x(s.start_s)
        wf.strip.append(Rect(x0, 8, max(1.0, x(s.start_s + s.duration_s) - x0), 26,
                             colour(s.family), f"{s.label} {fmt_s(s.duration_s)}",
                             family=s.family))
    lanes = _lanes(segs)
    if len(lanes) > MAX_ROWS:  # keep the lanes that hold the most time
        keep = set(sorted(lanes, key=lambda k: -sum(s.duration_s for s in lanes[k]))[:MAX_ROWS])
        wf.hidden = len(lanes) - MAX_ROWS
        lanes = {k: v for k, v in lanes.items() if k in keep}
    y = 50
    per_lane = max(1, MAX_STRIP // max(len(lanes), 1))
    for label, lane in lanes.items():
        total = sum(s.duration_s for s in lane)
        family = lane[0].family
        rects = [Rect(x(s.start_s), y + 3, max(1.0, x(s.start_s + s.duration_s) - x(s.start_s)),
                      ROW_H - 6, colour(family),
                      f"{label}: {fmt_s(s.duration_s)} from {fmt_s(s.start_s)}")
                 for s in _longest(lane, per_lane)]
        end_x = max(r.x + r.w for r in rects)
        value = fmt_s(total) + (f" in {len(lane)} parts" if len(lane) > 1 else "")
        wf.rows.append({"y": y, "label": short(label, 28), "full": label, "family": family,
                        "rects": rects, "value": value, "value_x": end_x + 5})
        y += ROW_H
    axis_y = y + 6
    wf.ticks = [{"x": x(t), "label": fmt_s(t) if t else "0"} for t in nice_ticks(lo, hi)]
    wf.ttft_x = x(req.client_ttft_s)
    wf.height, wf.axis_y = axis_y + 26, axis_y
    return wf


def _longest(segs: list[Segment], limit: int) -> list[Segment]:
    """At most ``limit`` segments, the longest, in time order (slivers below a pixel go)."""
    if len(segs) <= limit:
        return segs
    return sorted(sorted(segs, key=lambda s: -s.duration_s)[:limit], key=lambda s: s.start_s)


def build_stacked(analysis: Analysis, names: list[str]) -> dict[str, Any]:
    """One horizontal bar per scenario: its stage p50s stacked in pipeline order."""
    plot_w = WIDTH - LABEL_W - 160
    rows = []
    totals = {n: sum(analysis.scenarios[n].stages_p50.get(s, 0.0) for s in PIPELINE)
              for n in names}
    top = max(list(totals.values()) + [1e-9])
    bar_h, gap = 26, 12
    for i, name in enumerate(names):
        sc = analysis.scenarios[name]
        y, x0, rects = 10 + i * (bar_h + gap), float(LABEL_W), []
        for stage in PIPELINE:
            v = sc.stages_p50.get(stage, 0.0)
            if v <= 0:
                continue
            w = v / top * plot_w
            rects.append(Rect(x0, y, max(w, 1.0), bar_h, colour(stage),
                              f"{name} {stage} p50 {fmt_s(v)}",
                              label=fmt_s(v) if w > 52 else "", label_fill=text_colour(stage),
                              family=stage))
            x0 += w
        rows.append({"name": name, "label": short(name, 30), "y": y, "h": bar_h, "rects": rects,
                     "total": f"TTFT p50 {fmt_s(sc.ttft_p50_s)}, n={sc.n}", "end_x": x0 + 8})
    height = 10 + len(names) * (bar_h + gap) + 28
    ticks = [{"x": LABEL_W + t / top * plot_w, "label": fmt_s(t) if t else "0"}
             for t in nice_ticks(0, top)]
    return {"rows": rows, "height": height, "axis_y": height - 24, "ticks": ticks}


def _outcome(v: Verdict) -> str:
    if v.outcome:
        return v.outcome
    return "expanded" if v.stage != "none" else "within-noise"  # an earlier v1 writer's


def verdict_card(v: Verdict) -> dict[str, Any]:
    """A verdict as its card shows it: the headline, the fix, one bar per stage delta (the
    stages that grew materially marked), the chain, the noise and the facts, all in units."""
    outcome = _outcome(v)
    expanded = outcome == "expanded"
    ev = dict(v.evidence)
    deltas = ev.get("stage_deltas_s")
    deltas = {k: float(d) for k, d in deltas.items() if isinstance(d, (int, float))
              and not isinstance(d, bool) and math.isfinite(d)} if isinstance(deltas, dict) \
        else {}
    chain = {link.stage for link in v.chain}
    # shares of what the stage deltas add up to (the middle half's TTFT change), and only when
    # something expanded: a share of a change within the noise means nothing
    increase = ev.get("middle_half_ttft_delta_s", ev.get("ttft_delta_s"))
    increase = (increase if expanded and isinstance(increase, (int, float))
                and not isinstance(increase, bool) and increase > 0 else None)
    top = max([abs(d) for d in deltas.values()] + [1e-12])
    bars = [{"stage": stage, "value": fmt.fmt_signed_s(d) if d else "\u2013",
             "share": f"{d / increase:.0%}" if increase and d > 0 else "",
             "width": round(abs(d) / top * 100, 2), "fill": colour(stage) if d > 0 else
             NONE_COLOUR, "chosen": expanded and stage == v.stage, "in_chain": stage in chain}
            for stage, d in deltas.items()]
    links = [{"stage": link.stage, "where": link.substage or link.stage,
              "delta": fmt.fmt_signed_s(link.delta_s), "share": f"{link.share:.0%}",
              "rec": link.recommendation or "none", "quiet": link.beyond_noise is False,
              "fill": colour(link.stage)} for link in v.chain]
    advice = (RECOMMENDATIONS.get(v.recommendation, "") if v.stage == "none"
              or v.recommendation != "none" else OUTSIDE_WARMUP)
    if not expanded:
        advice = v.summary or OUTCOMES.get(outcome, advice)
    note = ev.get("note")
    return {
        "v": v, "outcome": outcome, "expanded": expanded, "headline": OUTCOMES.get(outcome, ""),
        "where": v.substage or v.stage, "family": semconv.stage_family(v.stage),
        "colour": NONE_COLOUR if v.recommendation == "none"
        else colour(semconv.stage_family(v.stage)),
        "delta": fmt_s(v.delta_s), "advice": advice, "bars": bars, "chain": links,
        "ttft": fmt.fmt_value("ttft_delta_s", ev["ttft_delta_s"]) if "ttft_delta_s" in ev
        else None, "noise": fmt_s(ev["noise_s"]) if isinstance(ev.get("noise_s"), (int, float))
        and not isinstance(ev.get("noise_s"), bool) else None,
        "note": fmt.fmt_value("note", note, 2000) if note is not None else None,
        "evidence": fmt.facts(ev),
        "change": change_lines(v.change),
    }


def build_context(analysis: Analysis) -> dict[str, Any]:
    by_scenario: dict[str, list[Request]] = {}
    for r in analysis.requests:
        by_scenario.setdefault(r.scenario, []).append(r)
    names = analysis.scenario_names()
    waterfalls: list[Waterfall | str] = []  # a bare name: a scenario without requests
    for name in names:
        reqs = by_scenario.get(name, [])
        if not reqs:
            waterfalls.append(name)
            continue
        sc = analysis.scenarios.get(name)
        target = sc.ttft_p50_s if sc else median(r.client_ttft_s for r in reqs)
        waterfalls.append(build_waterfall(name, reqs, target))
    summary = [{"name": n, "n": s.n, "ttft": fmt_s(s.ttft_p50_s),
                "stages": [fmt_s(v) if (v := s.stages_p50.get(st, 0.0)) else "\u2013"
                           for st in PIPELINE]}
               for n, s in analysis.scenarios.items()]
    verdicts = [verdict_card(v) for v in analysis.verdicts]
    run = analysis.run
    settings = [("client", run.client or "live traffic (no replay)"),
                ("sampling", fmt.fmt_value("sampling", run.sampling, 500)
                 if run.sampling is not None else "-"),
                ("concurrency", str(run.concurrency or "-")), ("driver", run.driver or "-"),
                ("models", ", ".join(run.models) or "?")]
    prompts = run.prompts if isinstance(run.prompts, dict) else (
        {"": run.prompts} if run.prompts is not None else {})
    for pname, p in list(prompts.items())[:20]:
        if isinstance(p, dict):
            desc = ", ".join(f"{k} {fmt.fmt_value(str(k), v, 80)}" for k, v in p.items())
        else:
            desc = fmt.fmt_value("prompt", p, 200)
        settings.append((f"prompt {pname}".strip(), desc))
    if run.repeat is not None:
        settings.append(("repeats of each switching scenario", str(run.repeat)))
    if run.repeat_warm is not None:
        settings.append(("repeats of each other scenario", str(run.repeat_warm)))
    if run.cold_requests is not None:
        settings.append(("cold requests after an activation", str(run.cold_requests)))
    if run.run_id:
        settings.append(("run id", run.run_id))
    settings += [("source", analysis.source or "?"), ("baseline", analysis.baseline or "?")]
    return {
        "version": __version__, "analysis": analysis, "settings": settings,
        "legend": [(f, colour(f)) for f in PIPELINE], "pipeline": PIPELINE,
        "stacked": build_stacked(analysis, [n for n in names if n in analysis.scenarios]),
        "waterfalls": waterfalls, "verdicts": verdicts, "summary": summary, "width": WIDTH,
        "label_w": LABEL_W,
        "verifications": build_verifications(analysis, WIDTH, LABEL_W),
        "forecasts": forecast_check.table(analysis),
    }



VBAR_H, VGAP, VTOP = 24, 10, 8


def build_verifications(analysis: Analysis, width: int, label_w: int) -> list[dict[str, Any]]:
    """Per change ``verify`` tried: two stacked bars, the original run and the re-run with the
    change, stage p50s in pipeline order on one scale."""
    out = []
    plot_w = width - label_w - 170
    for v in analysis.verifications:
        item: dict[str, Any] = {"v": v, "bars": None}
        if v.ttft_p50_before_s is not None and v.ttft_p50_after_s is not None:
            rows = [("before", v.stages_p50_before, v.ttft_p50_before_s),
                    ("with the change", v.stages_p50_after, v.ttft_p50_after_s)]
            top = max([sum(s.values()) for _, s, _ in rows] + [t for *_, t in rows] + [1e-9])
            bars = []
            for i, (label, stages, ttft) in enumerate(rows):
                y, x0, rects = VTOP + i * (VBAR_H + VGAP), float(label_w), []
                for stage in PIPELINE:
                    value = stages.get(stage, 0.0)
                    if value <= 0:
                        continue
                    w = value / top * plot_w
                    rects.append(Rect(x0, y, max(w, 1.0), VBAR_H, colour(stage),
                                      f"{label}: {stage} p50 {fmt_s(value)}",
                                      label=fmt_s(value) if w > 52 else "",
                                      label_fill=text_colour(stage), family=stage))
                    x0 += w
                bars.append({"label": label, "y": y, "h": VBAR_H, "rects": rects,
                             "total": f"TTFT p50 {fmt_s(ttft)}", "end_x": x0 + 8})
            height = VTOP + len(rows) * (VBAR_H + VGAP) + 26
            ticks = [{"x": label_w + t / top * plot_w, "label": fmt_s(t) if t else "0"}
                     for t in nice_ticks(0, top)]
            item["bars"] = {"rows": bars, "height": height, "axis_y": height - 22,
                            "ticks": ticks}
        out.append(item)
    return out


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("otel_ttft.tools.analysis", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["n"] = lambda v: f"{v:.1f}"  # SVG coordinates


def render_report(analysis: Analysis) -> str:
    return _ENV.get_template("report.html.j2").render(**build_context(analysis))


def write_report(analysis: Analysis, output: safe_io.Output | str | Path) -> Path | None:
    """Render, then write whole or not at all (the output rule, ``safe_io``: a half-written
    report is never left behind, a device or directory is never written over); returns the
    path written (None for stdout)."""
    html = render_report(analysis)
    try:
        target = output if isinstance(output, safe_io.Output) else safe_io.Output(output)
        target.write(html)
    except safe_io.OutputError as exc:
        raise ReportError(str(exc)) from None
    return target.path
