"""One vocabulary: every name is unique, every stage is in the design's families, every name is
used (the docs' reference tables, generated from it, are checked in test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

from otel_ttft import semconv


def _constants(prefix: str) -> dict[str, str]:
    return {k: v for k, v in vars(semconv).items() if k.startswith(prefix) and isinstance(v, str)}


def test_stage_values_are_unique_and_belong_to_a_design_family():
    stages = _constants("STAGE_")
    assert len(set(stages.values())) == len(stages)
    for value in stages.values():
        assert semconv.stage_family(value) in semconv.STAGE_FAMILIES, value
    assert set(semconv.ALL_STAGES) == set(stages.values())


def test_families_are_the_ttft_pipeline_and_first_decode_each_with_a_fix():
    """TTFT is the sum of the pipeline's stages; first_decode is reported outside it. A family
    outside the pipeline would never be in a breakdown, one without a fix never in a verdict."""
    from otel_ttft.tools.analysis.verdict import FIXES

    assert semconv.STAGE_FIRST_DECODE not in semconv.TTFT_PIPELINE
    assert len(set(semconv.TTFT_PIPELINE)) == len(semconv.TTFT_PIPELINE)
    assert set(semconv.STAGE_FAMILIES) == {*semconv.TTFT_PIPELINE, semconv.STAGE_FIRST_DECODE}
    for family in semconv.STAGE_FAMILIES:
        assert semconv.stage_family(family) == family and family in semconv.ALL_STAGES, family
    assert [f for f in semconv.TTFT_PIPELINE if f not in FIXES] == []


def test_vllm_span_table_maps_only_to_known_stages():
    assert set(semconv.VLLM_SPAN_STAGES.values()) <= set(semconv.ALL_STAGES)


def test_attribute_metric_and_span_names_are_unique():
    for prefix in ("ATTR_", "METRIC_", "SPAN_"):
        values = list(_constants(prefix).values())
        dupes = {v for v in values if values.count(v) > 1}
        assert not dupes, (prefix, dupes)


def test_every_name_is_used_by_the_package():
    vocabulary = Path(semconv.__file__).parent
    package = vocabulary.parent
    source = "\n".join(p.read_text() for p in package.rglob("*.py")
                       if vocabulary not in p.parents)
    own = "\n".join(p.read_text() for p in vocabulary.glob("*.py"))
    unused = []
    for name in vars(semconv):
        if not name.isupper() or name.startswith("_"):
            continue
        if re.search(rf"\b{name}\b", source) is None and len(re.findall(rf"\b{name}\b", own)) < 2:
            unused.append(name)
    assert not unused, f"semconv names nothing uses: {unused}"


def test_ttft_buckets_keep_the_genai_boundaries_and_reach_past_10_s():
    genai = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0]  # gen_ai.server.time_to_first_token's advisory boundaries
    buckets = list(semconv.TTFT_BUCKETS_S)
    assert buckets[:len(genai)] == genai
    assert buckets == sorted(buckets) and buckets[-1] >= 600


def test_activation_buckets_reach_an_hour():
    assert max(semconv.ACTIVATION_DURATION_BUCKETS_S) >= 3600
    buckets = list(semconv.ACTIVATION_DURATION_BUCKETS_S)
    assert buckets == sorted(buckets)
