"""The text report splits a request's TTFT into its stages, with first decode kept outside it."""

from __future__ import annotations

from otel_ttft import semconv
from otel_ttft.tools.analysis.traces import find_request_spans
from otel_ttft.tools.analysis.tree import render_tree

MS = 1_000_000


def _span(span_id, name, start_ms, end_ms, parent=None, **attrs):
    return {"trace_id": "a" * 32, "span_id": span_id, "parent_span_id": parent, "name": name,
            "kind": "SERVER", "start_ns": start_ms * MS, "end_ns": end_ms * MS,
            "attributes": attrs, "resource": {}, "events": [], "links": [],
            "status": {"code": "UNSET", "message": ""}}


def test_request_footer_sums_the_ttft_stages():
    r = "1" * 16
    spans = [
        _span(r, semconv.SPAN_REQUEST, 0, 100, **{semconv.ATTR_REQUEST_TTFT: 0.012}),
        _span("2" * 16, "Frontend input", 0, 2, r, **{semconv.ATTR_STAGE: "frontend"}),
        _span("3" * 16, "Queue", 2, 5, r, **{semconv.ATTR_STAGE: "queue"}),
        _span("4" * 16, "Prefill", 5, 11, r, **{semconv.ATTR_STAGE: "prefill"}),
        _span("5" * 16, "Frontend output", 11, 12, r, **{semconv.ATTR_STAGE: "frontend"}),
        _span("6" * 16, "First decode", 11, 20, r, **{semconv.ATTR_STAGE: "first_decode"}),
    ]
    (request,) = find_request_spans(spans)
    text = render_tree(request)
    assert "server TTFT 12.0 ms = frontend 3.00 ms + queue 3.00 ms + prefill 6.00 ms" in text
    assert "first_decode 9.00 ms (after the first token)" in text
    assert "coverage" not in text
