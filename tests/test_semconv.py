"""One vocabulary: every name is unique, every stage is in the design's families, the README
documents every stage, span name, attribute and metric."""

from __future__ import annotations

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


def test_attribute_and_metric_keys_are_unique():
    for prefix in ("ATTR_", "METRIC_", "SPAN_"):
        values = list(_constants(prefix).values())
        dupes = {v for v in values if values.count(v) > 1}
        # Two span constants may share vLLM's name on purpose (we enrich that span).
        if prefix != "SPAN_":
            assert not dupes, dupes


def test_readme_documents_every_name():
    text = README.read_text()
    missing = [v for p in ("STAGE_", "ATTR_", "METRIC_") for v in _constants(p).values()
               if f"`{v}`" not in text]
    assert not missing, f"README.md does not table: {missing}"


def test_activation_buckets_reach_an_hour():
    assert max(semconv.ACTIVATION_DURATION_BUCKETS_S) >= 3600
    buckets = list(semconv.ACTIVATION_DURATION_BUCKETS_S)
    assert buckets == sorted(buckets)
