"""One vocabulary: every name is unique, every stage is in the design's families, the README
documents every stage, span name, attribute and metric."""

from __future__ import annotations

import re
from pathlib import Path

from otel_ttft import semconv

README = Path(__file__).resolve().parents[1] / "README.md"


def _constants(prefix: str) -> dict[str, str]:
    return {k: v for k, v in vars(semconv).items() if k.startswith(prefix) and isinstance(v, str)}


def test_stage_values_are_unique_and_belong_to_a_design_family():
    stages = _constants("STAGE_")
    assert len(set(stages.values())) == len(stages)
    for value in stages.values():
        assert semconv.stage_family(value) in semconv.STAGE_FAMILIES, value
    assert set(semconv.ALL_STAGES) == set(stages.values())


def test_design_families_are_exactly_the_design_vocabulary():
    assert set(semconv.STAGE_FAMILIES) == {
        "switch", "load", "warmup", "queue", "prefill", "frontend", "network", "first_decode"}


def test_vllm_span_table_maps_only_to_known_stages():
    assert set(semconv.VLLM_SPAN_STAGES.values()) <= set(semconv.ALL_STAGES)


def test_attribute_metric_and_span_names_are_unique():
    for prefix in ("ATTR_", "METRIC_", "SPAN_"):
        values = list(_constants(prefix).values())
        dupes = {v for v in values if values.count(v) > 1}
        assert not dupes, (prefix, dupes)


# The vocabulary itself: read by analysis through stage_family() and by these tests.
_VOCABULARY = {"STAGE_FAMILIES", "ALL_STAGES"}


def test_every_name_is_used_by_the_package():
    package = Path(semconv.__file__).parent
    source = "\n".join(p.read_text() for p in package.rglob("*.py") if p.name != "semconv.py")
    own = Path(semconv.__file__).read_text()
    unused = []
    for name in vars(semconv):
        if not name.isupper() or name.startswith("_") or name in _VOCABULARY:
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


def test_readme_documents_every_name():
    text = README.read_text()
    missing = [v for p in ("STAGE_", "ATTR_", "METRIC_") for v in _constants(p).values()
               if f"`{v}`" not in text]
    assert not missing, f"README.md does not table: {missing}"


def test_activation_buckets_reach_an_hour():
    assert max(semconv.ACTIVATION_DURATION_BUCKETS_S) >= 3600
    buckets = list(semconv.ACTIVATION_DURATION_BUCKETS_S)
    assert buckets == sorted(buckets)
