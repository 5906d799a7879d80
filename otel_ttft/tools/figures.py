"""How each figure a GPU user reads is measured on Model Runner V1 and V2, and what checked it.

Data, read by ``otel-ttft doctor`` and by the docs (``docs/gpu-checks.md``, generated table
``gpu-figures``); ``tests/test_figures.py`` checks that every attribute is one of ours and every
test named here exists. "Checked" names the CPU test that compares the figure with an independent
reading on vLLM's real classes, and the GPU check that will (none of which has run on a GPU yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_ttft import semconv


@dataclass(frozen=True)
class Figure:
    """One figure: the attributes that carry it, on which span, how it is measured on each
    runner, and what checked it (``tests/FILE.py::TEST`` or a GPU check)."""

    name: str
    attributes: tuple[str, ...]
    span: str
    v1: str
    v2: str
    checked: tuple[str, ...]


_KV_V1 = "V1's GPUModelRunner.initialize_kv_cache (and the CPU runner's)"
_KV_V2 = "V2's GPUModelRunner.initialize_kv_cache"
FIGURES: tuple[Figure, ...] = (
    Figure("KV bytes", (semconv.ATTR_KV_BYTES, semconv.ATTR_KV_HOST_BYTES),
           semconv.SPAN_KV_ALLOC,
           f"{_KV_V1}: the KVCacheConfig it allocates from, each backing allocation once (the "
           "groups of a hybrid model share one buffer)",
           f"{_KV_V2}: the same config, the same rule",
           ("tests/test_kv_layout_vllm.py::test_a_shared_buffer_is_counted_once_and_capacity_is_"
            "vllms", "tests/test_kv_layout_vllm.py::test_the_allocation_span_on_v1_and_v2_carries"
            "_the_bytes_allocated", "tests/test_hybrid_cold_vllm.py::test_kv_bytes_and_tokens_are"
            "_what_vllm_allocated_and_says", "scripts/gpu-check part 0 (> 0 on each runner)")),
    Figure("KV blocks and token capacity",
           (semconv.ATTR_KV_BLOCKS, semconv.ATTR_KV_TOKEN_CAPACITY,
            semconv.ATTR_KV_MAX_CONCURRENCY, semconv.ATTR_KV_GROUPS,
            semconv.ATTR_KV_GROUP_SPECS, semconv.ATTR_KV_GROUP_LAYERS,
            semconv.ATTR_KV_GROUP_BLOCK_SIZES, semconv.ATTR_KV_GROUP_BLOCKS_PER_REQUEST,
            semconv.ATTR_KV_SEQUENCE_GROUPS, semconv.ATTR_KV_WINDOW_BLOCKS),
           semconv.SPAN_KV_ALLOC,
           f"{_KV_V1}: the pool's blocks; per group its spec's blocks per max_model_len request "
           "(vLLM's max_memory_usage_bytes / page_size_bytes); capacity = blocks / their sum x "
           "max_model_len, vLLM's own formula",
           f"{_KV_V2}: the same",
           ("tests/test_kv_layout_vllm.py::test_a_shared_buffer_is_counted_once_and_capacity_is_"
            "vllms", "tests/test_hybrid_cold_vllm.py::test_kv_bytes_and_tokens_are_what_vllm_"
            "allocated_and_says")),
    Figure("checkpoint reads apart from the copy",
           (semconv.ATTR_LOAD_FAULTED_BYTES, semconv.ATTR_READ_SECONDS,
            semconv.ATTR_READ_GB_PER_S, semconv.ATTR_PAGE_CACHE_RESIDENT,
            semconv.ATTR_PAGE_CACHE_RESIDENT_AFTER),
           f"{semconv.SPAN_SHARD_READ}, {semconv.SPAN_LOAD_WEIGHTS}",
           "the loader, whichever runner: each safetensors tensor's memory-mapped pages not "
           "cached (mincore on the tensor's memory) are faulted in inside the reader's timed "
           "step (MADV_POPULATE_READ), before the copy; residency of the file before and after",
           "the same loader",
           ("tests/test_load_faults.py::test_a_cold_tensor_reaches_the_copy_already_read",
            "tests/test_hybrid_cold_vllm.py::test_a_cold_loads_storage_reads_are_the_read_"
            "stage", "scripts/gpu-check-torch (a cold and a warm 1-2 GiB load: issue 55, the "
            "other half)")),
    Figure("host-to-device copy",
           (semconv.ATTR_LOAD_COPY_SECONDS, semconv.ATTR_H2D_BYTES, semconv.ATTR_H2D_GB_PER_S),
           semconv.SPAN_LOAD_WEIGHTS,
           "the consumer's time holding each tensor (copying it into its parameter), storage "
           "reads excluded since they happen in the read step; h2d on an accelerator only",
           "the same loader",
           ("tests/test_load_faults.py::test_a_cold_tensor_reaches_the_copy_already_read",
            "scripts/gpu-check-torch H2D rows (CUDA events)")),
    Figure("sleep and wake bytes",
           (semconv.ATTR_SLEEP_OFFLOADED_BYTES, semconv.ATTR_SLEEP_RELEASED_BYTES,
            semconv.ATTR_WAKE_RESTORED_BYTES, semconv.ATTR_WAKE_MAPPED_BYTES),
           f"a worker's {semconv.SPAN_SLEEP}, {semconv.SPAN_WAKE_UP}, {semconv.SPAN_DISCARD}",
           "the GPU worker (both runners): vLLM's CuMemAllocator allocations before and after "
           "its sleep, wake_up and discard",
           "the same worker and allocator",
           ("tests/test_sleep_workers.py::test_every_workers_sleep_sits_under_its_switch_with_"
            "its_bytes", "tests/test_sleep_workers.py::test_wake_up_records_the_bytes_copied_"
            "back", "scripts/gpu-check part 1 (sleep and wake on a real GPU)")),
    Figure("sleep, wake and release parents",
           (semconv.ATTR_SLEEP_LEVEL, semconv.ATTR_SWITCH_REASON),
           f"vllm.switch > EngineCore's {semconv.SPAN_SLEEP} or {semconv.SPAN_RELEASE_KV} > "
           "each worker's",
           "whatever the worker count: a worker's span under what called it (collective_rpc "
           "carries EngineCore's context; the executor's deferred sleep runs under EngineCore's "
           "open Sleep); level 0 ends when the pause completes",
           "the same (the worker and executor, not the runner)",
           ("tests/test_sleep_workers.py::test_every_workers_sleep_sits_under_its_switch_with_"
            "its_bytes", "tests/test_sleep_workers.py::test_level_0_pauses_only_and_ends_when_"
            "the_pause_completes", "tests/test_sleep_workers.py::test_releasing_the_kv_cache_is"
            "_a_switch_with_each_workers_discard", "scripts/gpu-check parts 1-2")),
)


def render() -> list[str]:
    """Doctor's lines: per figure, its attributes, how each runner measures it, what checked
    it."""
    lines = ["figures (how each is measured; docs/gpu-checks.md):"]
    for f in FIGURES:
        lines.append(f"  {f.name} [{', '.join(f.attributes)}] on {f.span}")
        lines.append(f"    V1: {f.v1}")
        lines.append(f"    V2: {f.v2}")
        lines.append(f"    checked: {'; '.join(f.checked)}")
    return lines


def table() -> str:
    """The docs' table (``<!-- reference: gpu-figures -->``)."""
    rows = ["| figure | attributes | on | V1 | V2 | checked by |", "|---|---|---|---|---|---|"]
    for f in FIGURES:
        attrs = "<br>".join(f"`{a}`" for a in f.attributes)
        checked = "<br>".join(f"`{c}`" if c.startswith("tests/") else c for c in f.checked)
        rows.append(f"| {f.name} | {attrs} | {f.span} | {f.v1} | {f.v2} | {checked} |")
    return "\n".join(rows) + "\n"
