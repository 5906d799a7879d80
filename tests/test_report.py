"""`otel-ttft report`: the page's content, its escaping, and the page as headless Chromium
renders it.

The browser tests need Debian's ``chromium`` (scripts/setup installs it); outside CI they skip
with the reason when it is missing, in CI they fail, like the vLLM tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections import Counter
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_ttft.tools.analysis.contract import PIPELINE, Analysis, parse_analysis
from otel_ttft.tools.analysis.report import (
    FAMILY_COLOURS,
    fmt_s,
    nice_ticks,
    render_report,
    representative,
    write_report,
)
from tests.analysis_fixture import PROFILES, build_analysis


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        msg = "Debian's chromium is not installed (scripts/setup installs it as root)"
        if os.environ.get("CI"):
            pytest.fail(msg)  # in CI a missing browser is a set-up bug, never a skip
        pytest.skip(msg)
    return path


def browse(chromium: str, page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{page.stem}"
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args,
         page.as_uri()],
        capture_output=True, text=True, timeout=180, check=True)


class Elements(HTMLParser):
    """(tag, attrs) of every start tag in a DOM dump."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))

    def having(self, tag: str, cls: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.found if t == tag and cls in (a.get("class") or "").split()]


def analysis(**kw) -> Analysis:
    return Analysis.model_validate(build_analysis(**kw))


# --- content, no browser ------------------------------------------------------------------------
def test_representative_is_the_request_closest_to_the_median() -> None:
    doc = analysis()
    reqs = [r for r in doc.requests if r.scenario == "cold-switch"]
    target = doc.scenarios["cold-switch"].ttft_p50_s
    pick = representative(reqs, target)
    assert pick.repeat_index == 1  # jitter 0.96, 1.00, 1.04: the middle one
    assert pick.client_ttft_s == target


def test_seconds_and_ticks_read_well() -> None:
    assert [fmt_s(x) for x in (12.34, 1.234, 0.456, 0.0078, 0.00012)] == [
        "12.3 s", "1.23 s", "456 ms", "7.8 ms", "0.12 ms"]
    assert nice_ticks(0, 10.6) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0, 0.069) == pytest.approx([0, 0.02, 0.04, 0.06])
    assert nice_ticks(-0.5, 2.5) == pytest.approx([-0.5, 0, 0.5, 1, 1.5, 2, 2.5])


HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def test_every_input_string_is_escaped(tmp_path: Path) -> None:
    data = build_analysis()
    data["source"] = HOSTILE
    data["run"]["models"] = [HOSTILE]
    data["run"]["client"] = HOSTILE
    data["run"]["prompts"][HOSTILE] = {HOSTILE: HOSTILE}
    data["scenarios"][HOSTILE] = data["scenarios"].pop("cold-switch")
    for r in data["requests"]:
        if r["scenario"] == "cold-switch":
            r.update(scenario=HOSTILE, model=HOSTILE, trace_id=HOSTILE)
            r["segments"][0]["substage"] = HOSTILE
            r["evidence"][HOSTILE] = HOSTILE
    data["verdicts"][0].update(scenario=HOSTILE, baseline=HOSTILE, recommendation=HOSTILE,
                               substage=HOSTILE, evidence={HOSTILE: [HOSTILE]})
    html = render_report(Analysis.model_validate(data))
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'onerror' not in html.replace("onerror=alert(2)&gt;", "")


def test_write_is_atomic_and_readable(tmp_path: Path) -> None:
    out = write_report(analysis(), tmp_path / "report.html")
    assert out.stat().st_mode & 0o044 == 0o044
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


# --- in a real browser --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered(chromium: str, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("report")
    doc = analysis()
    page = write_report(doc, tmp / "report.html")
    dom = browse(chromium, page, tmp, "--dump-dom").stdout
    shot = tmp / "report.png"
    # The whole page (about 6,300 px tall here), with room to spare: a window cut at 4,600 px
    # put the last stacked bars 200 px above the edge, and one CI run whose layout came out a
    # little taller lost them (the network colour's 437 pixels there, 176 left above).
    browse(chromium, page, tmp, f"--screenshot={shot}", f"--window-size=1200,{SHOT_HEIGHT}",
           "--run-all-compositor-stages-before-draw")
    return doc, page, dom, shot


SHOT_HEIGHT = 9000


def test_dom_has_a_waterfall_per_scenario_the_stacked_bars_and_every_verdict(rendered) -> None:
    doc, _, dom, _ = rendered
    el = Elements(dom)
    sections = [a["data-scenario"] for a in el.having("section", "scenario")]
    assert sections == list(PROFILES)
    assert len(el.having("svg", "waterfall")) == 6
    # one rect per segment of each representative request, one lane per sub-stage
    rows = el.having("rect", "segment")
    reps = [representative([r for r in doc.requests if r.scenario == s],
                           doc.scenarios[s].ttft_p50_s) for s in PROFILES]
    assert len(rows) == sum(len(r.segments) for r in reps)
    assert Counter(a["data-stage"] for a in rows)["warmup"] == 2 * 6 + 1  # 2 switches + adapter
    lanes = [a["data-lane"] for a in el.having("g", "lane")]
    assert len(lanes) == sum(len({s.label for s in r.segments}) for r in reps)
    assert len(el.having("svg", "stacked")) == 1
    assert [a["data-scenario"] for a in el.having("g", "bar")] == list(PROFILES)
    verdicts = el.having("article", "verdict")
    assert [a["data-scenario"] for a in verdicts] == [v.scenario for v in doc.verdicts]
    assert "tune-context" in dom and "TTFT tracks prompt tokens" in dom


def test_screenshot_shows_every_stage_colour(rendered) -> None:
    from PIL import Image

    _, _, _, shot = rendered
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, SHOT_HEIGHT)
    background = img.getpixel((img.size[0] - 1, img.size[1] - 1))
    assert img.crop((0, SHOT_HEIGHT - 600, 1200, SHOT_HEIGHT)).getcolors() == [
        (1200 * 600, background)]  # the page ended well inside the shot: nothing cut off
    counts = {rgb: n for n, rgb in img.getcolors(maxcolors=1 << 24)}
    for stage in PIPELINE:
        rgb = tuple(int(FAMILY_COLOURS[stage][i:i + 2], 16) for i in (1, 3, 5))
        # bars are drawn solid: hundreds of pixels of each family's exact colour
        assert counts.get(rgb, 0) > 200, (stage, counts.get(rgb, 0))


def test_page_loads_nothing(rendered, chromium: str, tmp_path: Path) -> None:
    _, page, _, _ = rendered
    text = page.read_text()
    assert "http://" not in text and "https://" not in text
    assert "default-src 'none'" in text

    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        # control: the detector sees a plain page's image load
        control = tmp_path / "control.html"
        control.write_text(f'<!DOCTYPE html><img src="{base}/control.png">')
        browse(chromium, control, tmp_path, "--dump-dom")
        assert hits == ["/control.png"]
        # the report's CSP alone blocks a load even if markup got through
        head = text.split("<style>")[0]
        csp = tmp_path / "csp.html"
        csp.write_text(f'{head}</head><body><img src="{base}/csp.png">'
                       f'<div style="background: url({base}/css.png)">x</div></body></html>')
        browse(chromium, csp, tmp_path, "--dump-dom")
        # and a report whose every string points at the server loads nothing
        bait = f'<img src="{base}/bait.png"><link rel=stylesheet href="{base}/bait.css">'
        data = build_analysis()
        data["source"] = data["run"]["client"] = bait
        data["run"]["models"] = [bait]
        for r in data["requests"]:
            r["model"] = bait
        hostile = write_report(Analysis.model_validate(data), tmp_path / "hostile.html")
        browse(chromium, hostile, tmp_path, "--dump-dom")
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/control.png"]


def test_parse_accepts_what_the_fixture_writes() -> None:
    doc = parse_analysis(json.dumps(build_analysis()))
    assert len(doc.requests) == 18 and list(doc.scenarios) == list(PROFILES)
    for r in doc.requests:  # the fixture keeps the contract: segments tile the client TTFT
        assert sum(r.stages.values()) == pytest.approx(r.client_ttft_s, rel=0.01)
        ends = [s.start_s + s.duration_s for s in r.segments]
        assert [s.start_s for s in r.segments[1:]] == pytest.approx(ends[:-1])
        assert ends[-1] == pytest.approx(r.client_ttft_s)


def test_many_segments_become_one_lane_each_with_bounded_rects() -> None:
    """5,000 alternating decode-like steps are two lanes (one per sub-stage), not 5,000 rows;
    the rects per lane are bounded, the longest kept."""
    from otel_ttft.tools.analysis.report import MAX_STRIP, build_context

    data = build_analysis(repeat=1)
    req = next(r for r in data["requests"] if r["scenario"] == "long-prompt")
    req["segments"] = [{"stage": "prefill", "substage": f"prefill.{i % 2}", "start_s": i * 0.001,
                        "duration_s": 0.001 * (1 + (i == 1234))} for i in range(5000)]
    empty = next(r for r in data["requests"] if r["scenario"] == "short-prompt")
    empty["segments"] = []
    data["scenarios"]["never-ran"] = dict(data["scenarios"]["short-prompt"])
    ctx = build_context(Analysis.model_validate(data))
    by_name = {w if isinstance(w, str) else w.scenario: w for w in ctx["waterfalls"]}
    long_wf = by_name["long-prompt"]
    assert [r["full"] for r in long_wf.rows] == ["prefill.0", "prefill.1"]
    assert sum(len(r["rects"]) for r in long_wf.rows) <= MAX_STRIP
    assert long_wf.rows[0]["value"] == "2.50 s in 2500 parts"  # every part counted
    assert long_wf.hidden == 0
    assert by_name["short-prompt"].rows == [] and by_name["never-ran"] == "never-ran"
    html = render_report(Analysis.model_validate(data))
    assert "carries no segments" in html and "No request of this scenario" in html


def test_a_lane_holds_every_segment_of_its_substage() -> None:
    """The cold-switch waterfall of the issue: load and warm-up slivers alternating; each
    sub-stage is one row whatever the number of its segments."""
    from otel_ttft.tools.analysis.report import build_waterfall

    data = build_analysis(repeat=1)
    req = next(r for r in data["requests"] if r["scenario"] == "cold-switch")
    t, segs = 0.0, []
    for i in range(50):
        sub = ("load.read", "warmup")[i % 2]
        segs.append({"stage": sub.split(".")[0], "substage": sub, "start_s": t,
                     "duration_s": 0.0004})
        t += 0.0004
    req["segments"] = segs
    doc = Analysis.model_validate(data)
    wf = build_waterfall("cold-switch", [r for r in doc.requests if r.scenario == "cold-switch"],
                         0.02)
    assert [(r["full"], len(r["rects"])) for r in wf.rows] == [("load.read", 25), ("warmup", 25)]


def test_adjacent_segments_of_one_substage_merge() -> None:
    from otel_ttft.tools.analysis.report import build_waterfall

    data = build_analysis(repeat=1)
    req = next(r for r in data["requests"] if r["scenario"] == "short-prompt")
    req["segments"] = [{"stage": "prefill", "substage": "prefill", "start_s": i * 0.01,
                        "duration_s": 0.01} for i in range(10)]
    doc = Analysis.model_validate(data)
    wf = build_waterfall("short-prompt", [r for r in doc.requests
                                          if r.scenario == "short-prompt"], 0.1)
    assert [(r["full"], r["value"]) for r in wf.rows] == [("prefill", "100 ms")]


def test_disk_full_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the page is written: an error, and neither the page nor the
    temporary file beside it is left (a real full disk, as a file-size limit, is in
    test_commands_hostile)."""
    import errno

    from otel_ttft.tools import safe_io
    from otel_ttft.tools.analysis import report

    def full(self, _):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safe_io._Text, "write", full)
    with pytest.raises(report.ReportError, match="(?i)no space left on device"):
        write_report(analysis(), tmp_path / "report.html")
    assert list(tmp_path.iterdir()) == []


class Text(HTMLParser):
    """What a reader sees: text outside <style> and <head>, tooltips (<title> in SVG) included."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "head")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "head")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join(self.parts)


def test_verdict_cards_show_words_and_units_never_raw_keys() -> None:
    doc = analysis()
    html = render_report(doc)
    text = Text(html).text
    keys = {k for v in doc.verdicts for k in v.evidence} | {
        k for r in doc.requests for k in r.evidence.model_dump()}
    raw = sorted(k for k in keys if "_" in k and k in text)
    assert not raw, raw
    assert "stage_deltas_s" not in text and "{" not in text
    cold = next(v for v in doc.verdicts if v.scenario == "cold-switch")
    card = html[html.index('data-scenario="cold-switch" data-outcome'):]
    card = card[:card.index("</article>")]
    card_text = Text(card).text
    assert "181.4 MB" in card_text  # 181,403,648 bytes
    assert "76 MB/s" in card_text  # 0.0756 GB/s
    assert "noise" in card_text and "\u00b14.0 ms" in card_text
    assert card.count('class="bar-row') == len(PIPELINE)
    assert card.count("<li data-stage=") == len(cold.chain) > 0
    assert Text(card).text.count("of the increase") == len(cold.chain)


def test_cards_of_earlier_v1_writers_still_render() -> None:
    """An analysis.json without outcome, chain or stage deltas (written before them)."""
    data = build_analysis()
    for v in data["verdicts"]:
        for key in ("outcome", "chain", "summary"):
            v.pop(key)
        v["evidence"].pop("stage_deltas_s")
    html = render_report(Analysis.model_validate(data))
    assert html.count('class="card verdict"') == len(data["verdicts"])
    assert 'class="bar-row' not in html


def test_units_follow_the_key_and_unknown_keys_read_as_words() -> None:
    from otel_ttft.tools.analysis.report_format import fmt_bytes, fmt_value, label_of

    assert fmt_value("read_gb_per_s_p50", 1.234) == "1.23 GB/s"
    assert fmt_value("some_gb_per_s", 0.0756) == "76 MB/s"
    assert fmt_value("extra_wait_s", 0.0042) == "4.2 ms"
    assert fmt_value("ttft_delta_s", -0.5) == "\u2212500 ms"
    assert fmt_value("baseline_model_was_resident_share", 1.0) == "100%"
    assert fmt_value("cold", False) == "no" and fmt_value("x", None) == "not measured"
    assert [fmt_bytes(b) for b in (11_027_568, 4.2e9, 512)] == ["11.0 MB", "4.20 GB", "512 B"]
    assert label_of("read_retry_count") == "Read retry count"
    assert label_of("queue_wait_p50_s") == "Queue wait p50"
    deep = {"a_b": [{"c_d": [[1]]}]}
    assert "_" not in fmt_value("nested_thing", deep)
