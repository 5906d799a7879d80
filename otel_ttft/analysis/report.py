"""``otel-ttft report``: one self-contained HTML page from an analysis.json.

Geometry (inline SVG) is computed here; ``templates/report.html.j2`` lays it out with Jinja2's
autoescaping on, so every string from the (untrusted) input is escaped in one place. The page
loads nothing: its CSP forbids every fetch, styles are inline, there is no script.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import jinja2

from otel_ttft import semconv
from otel_ttft.analysis.contract import PIPELINE, Analysis, Request, Segment
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
    "none": "No stage expanded materially against the baseline.",
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


def fmt_s(seconds: float) -> str:
    """Seconds as an operator reads them: 12.3 s, 1.23 s, 456 ms, 7.8 ms, 0.12 ms."""
    a = abs(seconds)
    if a >= 10:
        return f"{seconds:.1f} s"
    if a >= 1:
        return f"{seconds:.2f} s"
    if a >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    if a >= 0.001:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.2f} ms"


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
        rows.append(("bytes read", f"{ev.bytes_read:,}"))
    if ev.page_cache_resident_ratio is not None:
        rows.append(("page cache resident", f"{ev.page_cache_resident_ratio:.0%}"))
    if ev.compile_cache_hit is not None:
        rows.append(("compile cache hit", "yes" if ev.compile_cache_hit else "no"))
    if ev.model_was_resident is not None:
        rows.append(("model was resident", "yes" if ev.model_was_resident else "no"))
    rows.append(("activation trace", req.activation_trace_id or "none"))
    return rows


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
    strip = segs
    if len(strip) > MAX_STRIP:
        longest = sorted(segs, key=lambda s: -s.duration_s)[:MAX_STRIP]
        strip = sorted(longest, key=lambda s: s.start_s)
    for s in strip:
        x0 = x(s.start_s)
        wf.strip.append(Rect(x0, 8, max(1.0, x(s.start_s + s.duration_s) - x0), 26,
                             colour(s.family), f"{s.label} {fmt_s(s.duration_s)}",
                             family=s.family))
    rows = segs
    if len(rows) > MAX_ROWS:
        keep = sorted(segs, key=lambda s: -s.duration_s)[:MAX_ROWS]
        rows = sorted(keep, key=lambda s: s.start_s)
        wf.hidden = len(segs) - len(rows)
    y = 50
    for s in rows:
        x0, w = x(s.start_s), max(1.0, x(s.start_s + s.duration_s) - x(s.start_s))
        wf.rows.append({
            "y": y, "label": short(s.label, 28), "full": s.label, "family": s.family,
            "rect": Rect(x0, y + 3, w, ROW_H - 6, colour(s.family),
                         f"{s.label}: {fmt_s(s.duration_s)} from {fmt_s(s.start_s)}"),
            "value": fmt_s(s.duration_s), "value_x": x0 + w + 5,
        })
        y += ROW_H
    axis_y = y + 6
    wf.ticks = [{"x": x(t), "label": fmt_s(t) if t else "0"} for t in nice_ticks(lo, hi)]
    wf.ttft_x = x(req.client_ttft_s)
    wf.height, wf.axis_y = axis_y + 26, axis_y
    return wf


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


def _show(value: Any, limit: int = 300, key: str = "") -> str:
    if key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt_s(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    try:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError):
        text = "(nested too deeply to show)"
    return short(text, limit)


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
    verdicts = [{
        "v": v, "where": v.substage or v.stage, "family": semconv.stage_family(v.stage),
        "colour": NONE_COLOUR if v.recommendation == "none"
        else colour(semconv.stage_family(v.stage)),
        "delta": fmt_s(v.delta_s),
        "advice": (RECOMMENDATIONS.get(v.recommendation, "") if v.stage == "none"
                   or v.recommendation != "none" else OUTSIDE_WARMUP),
        "evidence": [(k, _show(val, key=k)) for k, val in list(v.evidence.items())[:40]],
    } for v in analysis.verdicts]
    run = analysis.run
    settings = [("client", run.client or "live traffic (no replay)"),
                ("sampling", _show(run.sampling, 500) if run.sampling is not None else "-"),
                ("concurrency", str(run.concurrency or "-")), ("driver", run.driver or "-"),
                ("models", ", ".join(run.models) or "?")]
    prompts = run.prompts if isinstance(run.prompts, dict) else (
        {"": run.prompts} if run.prompts is not None else {})
    for pname, p in list(prompts.items())[:20]:
        if isinstance(p, dict):
            desc = ", ".join(f"{k} {_show(v, 80)}" for k, v in p.items())
        else:
            desc = _show(p, 200)
        settings.append((f"prompt {pname}".strip(), desc))
    if run.repeat is not None:
        settings.append(("repeat", str(run.repeat)))
    if run.run_id:
        settings.append(("run id", run.run_id))
    settings += [("source", analysis.source or "?"), ("baseline", analysis.baseline or "?")]
    return {
        "version": __version__, "analysis": analysis, "settings": settings,
        "legend": [(f, colour(f)) for f in PIPELINE], "pipeline": PIPELINE,
        "stacked": build_stacked(analysis, [n for n in names if n in analysis.scenarios]),
        "waterfalls": waterfalls, "verdicts": verdicts, "summary": summary, "width": WIDTH,
        "label_w": LABEL_W,
    }


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("otel_ttft.analysis", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["n"] = lambda v: f"{v:.1f}"  # SVG coordinates


def render_report(analysis: Analysis) -> str:
    return _ENV.get_template("report.html.j2").render(**build_context(analysis))


def write_report(analysis: Analysis, path: str | Path) -> Path:
    """Render and write atomically (a half-written report is never left behind)."""
    html = render_report(analysis)
    path = Path(path)
    if path.is_dir():
        raise ReportError(f"{path}: is a directory; give a file name such as report.html")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=parent)
        try:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the report from a web server
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(html)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ReportError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path
