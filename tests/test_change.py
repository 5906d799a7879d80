"""Concrete changes (analysis/change.py) from evidence, named in the installed vLLM's words
(analysis/knobs.py): the rules on synthetic evidence, the template reading and editing, and a
check of every name the tool can print against vLLM's own parser and ``vllm.envs``."""

from __future__ import annotations

import os

import pytest

from otel_ttft import semconv
from otel_ttft.tools.analysis import change, knobs
from otel_ttft.tools.analysis.breakdown import ActivationSummary
from otel_ttft.tools.replay.drivers import DEFAULT_TEMPLATE, expand

GIB = 2**30


@pytest.fixture(scope="module")
def vocab() -> knobs.Vocabulary:
    try:
        return knobs.vocabulary()
    except knobs.KnobsUnavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no vLLM to read knobs from: {exc}")


def _row(scenario: str, *, ttft: float, stages: dict | None = None, subs: dict | None = None,
         model: str = "A", prompt: str = "short", tokens: int = 20, waiting: int = 0) -> dict:
    st = dict.fromkeys(semconv.TTFT_PIPELINE, 0.0)
    st.update(stages or {})
    return {"scenario": scenario, "model": model, "prompt": prompt, "prompt_tokens": tokens,
            "client_ttft_s": ttft, "stages": st, "substages": subs or {},
            "waiting_at_arrival": waiting, "evidence": {}}


def _act(model: str, **facts) -> ActivationSummary:
    return ActivationSummary("t" + model, model, "start", 0, 1, [], bytes_read=facts.pop(
        "bytes_read", 0), facts=facts)


def _run(template_a: str = DEFAULT_TEMPLATE, template_b: str = DEFAULT_TEMPLATE, *,
         concurrency: int = 1, driver: str = "restart", adapters: dict | None = None) -> dict:
    return {"driver": driver, "concurrency": concurrency, "sampling": {"max_tokens": 8},
            "setup": {"version": 1, "driver": driver, "max_model_len": 2048, "max_tokens": 8,
                      "adapters": adapters or {},
                      "targets": [{"name": "A", "template": template_a},
                                  {"name": "B", "template": template_b}]}}


def _verdict(scenario: str, stage: str, substage: str | None, rec: str, **evidence) -> dict:
    return {"scenario": scenario, "baseline": "short-prompt", "stage": stage,
            "substage": substage, "recommendation": rec, "evidence": evidence}


FITTING = [_act("A", model_bytes=4_000_000, kv_bytes=GIB, device_memory_bytes=24 * GIB,
                host_memory_bytes=24 * GIB, device_type="cpu"),
           _act("B", model_bytes=10_000_000, kv_bytes=GIB, device_memory_bytes=24 * GIB,
                host_memory_bytes=24 * GIB, device_type="cpu")]
BASE = [_row("short-prompt", ttft=0.05, stages={"prefill": 0.03})]


def _ids(ch: dict) -> list[str]:
    return [c["id"] for c in ch["candidates"]]


def test_compile_in_the_switch_gets_a_durable_cache_filled_once(vocab):
    v = _verdict("cold-switch", "warmup", "warmup.compile", "persist-artifacts",
                 compile_cache_hit=False)
    rows = [_row("cold-switch", ttft=60, model="B", subs={"warmup.compile": 28})]
    acts = [_act("B", compile_cache_dir="/tmp/otel-ttft-cold-x/torch_compile_cache")]
    ch = change.propose(v, rows, BASE, _run(), acts, vocab)
    first = ch["candidates"][0]
    assert first["id"] == "compile-cache" and first["models"] == ["B"]
    assert set(first["env"]) >= {"VLLM_CACHE_ROOT"} and first["durable"] == list(first["env"])
    assert first["env"]["VLLM_CACHE_ROOT"] == vocab.env_defaults["VLLM_CACHE_ROOT"]
    assert first["prepare"] == change.FILL_CACHE and not first["missing"]
    assert first["stage"] == "warmup.compile"
    assert "28.0 s" in first["reason"] and "otel-ttft-cold-x" in first["reason"]
    assert ch["summary"].startswith("VLLM_CACHE_ROOT=")


def test_profile_run_gets_the_measured_kv_size(vocab):
    v = _verdict("cold-switch", "warmup", "warmup.profile", "persist-artifacts")
    rows = [_row("cold-switch", ttft=60, model="B", subs={"warmup.profile": 30})]
    ch = change.propose(v, rows, BASE, _run(), [_act("B", kv_bytes=GIB)], vocab)
    assert _ids(ch) == ["explicit-kv-size"]
    assert ch["candidates"][0]["args"] == ["--kv-cache-memory-bytes", str(GIB)]


def test_graph_capture_limits_sizes_to_the_observed_concurrency_on_gpu_only(vocab):
    v = _verdict("cold-switch", "warmup", "warmup.graph_capture", "persist-artifacts")
    rows = [_row("cold-switch", ttft=60, model="B", subs={"warmup.graph_capture": 20})]
    ch = change.propose(v, rows, BASE, _run(concurrency=4), [
        _act("B", graph_batch_sizes=[1, 2, 4, 8, 16, 32])], vocab)
    assert _ids(ch) == ["capture-sizes", "compile-cache"]
    sizes = ch["candidates"][0]
    assert sizes["args"] == ["--cudagraph-capture-sizes", "1", "2", "4"] and sizes["gpu_only"]


def test_restart_switch_goes_resident_when_both_fit_then_sleep(vocab):
    v = _verdict("switch-back", "warmup", "warmup.process_start", "keep-resident")
    rows = [_row("switch-back", ttft=50, subs={"warmup.process_start": 30})]
    ch = change.propose(v, rows, BASE, _run(), FITTING, vocab)
    assert _ids(ch) == ["resident", "sleep"]
    resident, sleep = ch["candidates"]
    assert resident["driver"] == "resident" and resident["models"] == ["A", "B"]
    assert resident["args"] == []  # CPU: no memory fraction to split
    assert "fit in" in resident["reason"] and "2.01 GiB" in resident["reason"]
    assert sleep["driver"] == "sleep" and sleep["gpu_only"] and sleep["sleep_level"] == 1
    assert "--enable-sleep-mode" in sleep["args"]
    assert sleep["env"] == {"VLLM_SERVER_DEV_MODE": "1"}


def test_models_that_do_not_fit_sleep_and_a_gpu_splits_its_memory(vocab):
    v = _verdict("switch-back", "switch", None, "keep-resident")
    rows = [_row("switch-back", ttft=50, stages={"switch": 20})]
    big = [_act(m, model_bytes=60 * GIB, kv_bytes=10 * GIB, device_memory_bytes=80 * GIB,
                host_memory_bytes=100 * GIB, device_type="cuda") for m in ("A", "B")]
    ch = change.propose(v, rows, BASE, _run(), big, vocab)
    assert _ids(ch) == ["sleep"]  # 140 GiB on an 80 GiB device: only sleep can work
    assert ch["candidates"][0]["sleep_level"] == 1  # B's 60 GiB fit the 100 GiB host
    small = [_act(m, model_bytes=4 * GIB, kv_bytes=8 * GIB, device_memory_bytes=80 * GIB,
                  host_memory_bytes=8 * GIB, device_type="cuda") for m in ("A", "B")]
    ch = change.propose(v, rows, BASE, _run(), small, vocab)
    assert _ids(ch) == ["resident", "sleep"]
    resident = ch["candidates"][0]
    assert resident["args"][0] == "--gpu-memory-utilization"
    assert 0.18 <= float(resident["args"][1]) <= 0.45  # 12 GiB x 1.25 of 80 GiB, rounded up
    level = ch["candidates"][1]["sleep_level"]
    assert level == 1  # 4 GiB of weights in 8 GiB of host RAM, under 80 %


def test_adapter_load_gets_lora_slots_and_cold_reads_get_loader_options(vocab):
    v = _verdict("adapter-switch", "warmup", "warmup.adapter", "keep-resident")
    rows = [_row("adapter-switch", ttft=1.2, model="lora-b", subs={"warmup.adapter": 1.1})]
    ch = change.propose(v, rows, BASE, _run(adapters={"lora-a": "/a", "lora-b": "/b"}),
                        FITTING, vocab)
    assert _ids(ch) == ["lora-slots"]
    assert ch["candidates"][0]["args"] == ["--max-loras", "2", "--max-cpu-loras", "2"]
    assert ch["candidates"][0]["models"] == ["A"]  # adapters live on A's server
    v = _verdict("cold-switch", "load", "load.read", "keep-resident",
                 page_cache_resident_ratio_p50=0.0)
    rows = [_row("cold-switch", ttft=30, model="B", subs={"load.read": 24})]
    ch = change.propose(v, rows, BASE, _run(), FITTING, vocab)
    ids = _ids(ch)
    assert ids[:2] == ["resident", "sleep"]
    if "prefetch" in vocab.choices("--safetensors-load-strategy"):
        assert "prefetch" in ids
    for c in ch["candidates"]:
        if c["id"].startswith("loader-"):
            package = {"loader-runai_streamer": "runai_model_streamer",
                       "loader-fastsafetensors": "fastsafetensors"}[c["id"]]
            assert (package in c["missing"]) == (not vocab.loader_packages.get(package))


def test_queue_gets_the_kv_budget_the_demand_needs(vocab):
    template = DEFAULT_TEMPLATE + " --num-gpu-blocks-override 17 --max-model-len 2048"
    v = _verdict("long-prompt", "queue", None, "tune-admission")
    rows = [_row("long-prompt", ttft=3, prompt="long", tokens=1900, stages={"queue": 2})] * 4
    acts = [_act("A", kv_blocks=17, kv_block_size=128, kv_bytes=17 * 128 * 4096)]
    ch = change.propose(v, rows, BASE, _run(template, concurrency=4), acts, vocab)
    assert _ids(ch) == ["kv-budget"]
    kv = ch["candidates"][0]
    assert kv["args"] == ["--num-gpu-blocks-override", "60"]  # 4 x ceil(1908 / 128) = 4 x 15
    assert kv["replaces"] == {"--num-gpu-blocks-override": "--num-gpu-blocks-override 17"}
    # without an override in the template the same demand becomes bytes
    ch = change.propose(v, rows, BASE, _run(concurrency=4), acts, vocab)
    assert ch["candidates"][0]["args"] == ["--kv-cache-memory-bytes", str(60 * 128 * 4096)]


def test_queue_behind_too_few_sequence_slots_raises_max_num_seqs_first(vocab):
    template = DEFAULT_TEMPLATE.replace("--max-num-seqs 4", "--max-num-seqs 2")
    v = _verdict("short-prompt-burst", "queue", None, "tune-admission")
    rows = [_row("x", ttft=0.5, stages={"queue": 0.4})] * 8
    acts = [_act("A", kv_blocks=1000, kv_block_size=128, kv_bytes=GIB)]
    ch = change.propose(v, rows, BASE, _run(template, concurrency=8), acts, vocab)
    assert _ids(ch) == ["max-num-seqs"]
    assert ch["candidates"][0]["args"] == ["--max-num-seqs", "8"]
    assert ch["candidates"][0]["replaces"] == {"--max-num-seqs": "--max-num-seqs 2"}


OFF = DEFAULT_TEMPLATE + " --no-enable-prefix-caching"  # the replay's default is vLLM's: on


def test_repeated_long_prompt_without_prefix_caching_turns_it_on(vocab):
    v = _verdict("long-prompt", "prefill", None, "tune-context")
    rows = [_row("long-prompt", ttft=1, prompt="long", tokens=1900, stages={"prefill": 0.9})] * 3
    ch = change.propose(v, rows, BASE, _run(OFF), [], vocab)
    assert _ids(ch) == ["prefix-caching", "chunked-prefill", "shorter-context"]
    prefix, chunk, client = ch["candidates"]
    assert prefix["args"] == ["--enable-prefix-caching"]
    assert prefix["replaces"] == {"--enable-prefix-caching": "--no-enable-prefix-caching"}
    assert change.describe(prefix) == "--enable-prefix-caching (was --no-enable-prefix-caching)"
    assert chunk["args"] == ["--max-num-batched-tokens", "2048"]
    assert client["side"] == change.SIDE_CLIENT and not client["args"]
    # already on, or on by vLLM's default: nothing to turn on
    on = DEFAULT_TEMPLATE + " --enable-prefix-caching"
    for template in (on, DEFAULT_TEMPLATE):
        assert "prefix-caching" not in _ids(change.propose(v, rows, BASE, _run(template), [],
                                                           vocab))
    # the replay's long prompts share no prefix (each starts with its own number): repeats of
    # the label are not repeats of a prefix, and caching would not help them
    run = {**_run(OFF), "prompts": {"long": {"tokens": 1900, "shared_prefix_tokens": 0},
                                    "short": {"tokens": 300, "shared_prefix_tokens": 260}}}
    assert "prefix-caching" not in _ids(change.propose(v, rows, BASE, run, [], vocab))
    chat = [{**r, "prompt": "short"} for r in rows]
    (on,) = [c for c in change.propose(v, chat, BASE, run, [], vocab)["candidates"]
             if c["id"] == "prefix-caching"]
    assert on["reason"].startswith("3 prompts sharing a 260-token prefix were sent with prefix "
                                   "caching off"), on["reason"]


def test_a_compile_on_first_use_is_warmed_by_a_request_as_users_send_it(vocab):
    sub = semconv.STAGE_WARMUP_STEP_COMPILE
    v = _verdict("switch-back", "warmup", sub, "warm-up")
    rows = [_row("switch-back", ttft=1.2, stages={"warmup": 1.1}, subs={sub: 1.05})] * 3
    run = {**_run(), "sampling": {"temperature": 0.0, "max_tokens": 8, "seed": 1,
                                  "logprobs": 2}}
    (warm,) = change.propose(v, rows, BASE, run, [], vocab)["candidates"]
    assert warm["id"] == "first-use-warm-up" and warm["prepare"] == change.WARM_PREFIX
    assert warm["side"] == change.SIDE_DRIVER and warm["stage"] == sub
    assert not warm["missing"] and not warm["args"] and not warm["env"]
    assert "1.05 s" in warm["reason"] and "2 logprobs per token" in warm["reason"]
    # without logprobs in the run's sampling, nothing is claimed about what users ask
    (plain,) = change.propose(v, rows, BASE, _run(), [], vocab)["candidates"]
    assert "logprobs" not in plain["reason"]


def test_a_cold_prefix_cache_is_warmed_after_activation_or_kept_resident(vocab):
    sub = semconv.STAGE_PREFILL_UNCACHED_PREFIX
    v = _verdict("switch-back", "prefill", sub, "warm-up", uncached_prefix_tokens_p50=384,
                 baseline_cached_share_p50=0.96)
    rows = [_row("switch-back", ttft=0.3, stages={"prefill": 0.2}, subs={sub: 0.19})] * 3
    ch = change.propose(v, rows, BASE, _run(), [], vocab)
    assert _ids(ch) == ["prefix-warm-up", "resident"]
    warm, resident = ch["candidates"]
    assert warm["prepare"] == change.WARM_PREFIX and warm["side"] == change.SIDE_DRIVER
    assert not warm["missing"] and not warm["args"] and not warm["env"]
    assert "POST /v1/chat/completions" in warm["reason"]  # vLLM's own route
    assert "384 prompt tokens" in warm["reason"] and "96%" in warm["reason"]
    assert warm["stage"] == sub and resident["stage"] == sub
    assert "one request as users send it (shared prefix, their options) after activation" \
        in change.describe(warm)
    assert resident["driver"] == "resident" and resident["models"] == ["A", "B"]
    if vocab.sleep_clears_prefix_cache_from is not None:  # read from vLLM's EngineCore.sleep
        assert f"sleeps at level {vocab.sleep_clears_prefix_cache_from}" in resident["reason"]
    # already resident: only the warm-up is left
    assert _ids(change.propose(v, rows, BASE, _run(driver="resident"), [], vocab)) == [
        "prefix-warm-up"]
    # a route this vLLM lacks is named missing, never assumed
    lacking = knobs.Vocabulary(**{**vocab.__dict__, "routes": frozenset({"/v1/completions"})})
    ch = change.propose(v, rows, BASE, _run(), [], lacking)
    assert ch["candidates"][0]["missing"] == ["/v1/chat/completions"]
    # the front end's first use is warm-up too, with nothing computed for it
    first_use = _verdict("x", "warmup", "warmup.first_use", "warm-up")
    assert change.propose(first_use, rows, BASE, _run(), [], vocab)["candidates"] == []


def test_no_expansion_and_side_stages_have_nothing_to_change(vocab):
    for stage in ("none", "network"):
        ch = change.propose(_verdict("x", stage, None, "none"), [], BASE, _run(), [], vocab)
        assert ch["candidates"] == [] and ch["summary"].startswith("nothing to change")


def test_without_vllm_the_names_are_not_claimed():
    v = _verdict("cold-switch", "warmup", "warmup.compile", "persist-artifacts")
    ch = change.propose(v, [_row("cold-switch", ttft=9, model="B")], BASE, _run(), [], None,
                        "vLLM is not installed in this environment")
    assert ch["unchecked"] == "vLLM is not installed in this environment"
    assert all(c["missing"] for c in ch["candidates"])
    assert "(names unchecked: vLLM is not installed in this environment)" in ch["summary"]


def test_template_is_read_and_edited_in_vllms_terms(vocab):
    assert knobs.TemplateArgs(DEFAULT_TEMPLATE, vocab).get("enable_prefix_caching") is None
    args = knobs.TemplateArgs(OFF, vocab)
    assert args.get("max_num_seqs") == "4" and args.get("enable_prefix_caching") is False
    assert args.get("max_model_len") == "512" and not args.sets("num_gpu_blocks_override")
    edited = knobs.edit_template(OFF, vocab, ["--enable-prefix-caching",
                                                           "--max-num-seqs=8"],
                                 {"VLLM_CACHE_ROOT": "/durable dir/{x}"})
    again = knobs.TemplateArgs(edited, vocab)
    assert again.get("enable_prefix_caching") is True and again.get("max_num_seqs") == "8"
    assert "--no-enable-prefix-caching" not in edited
    argv = expand(edited, model="/m", name="n", port=1, host="127.0.0.1", python="py",
                  instrument="oi")
    assert argv[:2] == ["env", "VLLM_CACHE_ROOT=/durable dir/{x}"]  # braces kept literal
    assert argv[2:5] == ["oi", "py", "-m"]
    assert [a for a in argv if a.startswith("--max-num-seqs")] == ["--max-num-seqs=8"]
    config = knobs.edit_template(DEFAULT_TEMPLATE, vocab,
                                 ["--compilation-config", '{"cache_dir": "/c"}'])
    argv = expand(config, model="/m", name="n", port=1, host="h", python="p", instrument="i")
    assert argv[-2:] == ["--compilation-config", '{"cache_dir": "/c"}']


def test_describe_reads_like_the_command_line():
    c = {"driver": "sleep", "sleep_level": 1, "env": {"VLLM_SERVER_DEV_MODE": "1"},
         "args": ["--enable-sleep-mode"], "replaces": {"--max-num-seqs": "--max-num-seqs 2"}}
    assert change.describe(c) == ("driver sleep (level 1) VLLM_SERVER_DEV_MODE=1 "
                                  "--enable-sleep-mode (was --max-num-seqs 2)")


ALL_CASES = [
    (test_compile_in_the_switch_gets_a_durable_cache_filled_once, "persist-artifacts",
     "warmup.compile"),
    (None, "persist-artifacts", "warmup.graph_capture"),
    (None, "persist-artifacts", "warmup.profile"),
    (None, "keep-resident", "warmup.process_start"),
    (None, "keep-resident", "load.read"),
    (None, "keep-resident", "warmup.adapter"),
    (None, "tune-admission", "queue"),
    (None, "tune-admission", "warmup.kv_alloc"),
    (None, "tune-context", "prefill"),
    (test_a_cold_prefix_cache_is_warmed_after_activation_or_kept_resident, "warm-up",
     "prefill.uncached_prefix"),
]


def every_printable_change(vocab) -> list[dict]:
    """Every candidate the rules can produce, on evidence that makes each of them fire."""
    template = OFF.replace("--max-num-seqs 4", "--max-num-seqs 2") + \
        " --num-gpu-blocks-override 17"
    facts = dict(model_bytes=4 * GIB, kv_bytes=8 * GIB, kv_blocks=17, kv_block_size=128,
                 device_memory_bytes=80 * GIB, host_memory_bytes=8 * GIB, device_type="cuda",
                 graph_batch_sizes=[1, 2, 4, 8])
    acts = [_act("A", **facts), _act("B", **facts)]
    out = []
    for _, rec, sub in ALL_CASES:
        stage = sub.partition(".")[0]
        v = _verdict("s", stage, sub if "." in sub else None, rec)
        rows = [_row("s", ttft=9, prompt="long", tokens=1900, subs={sub: 5},
                     stages={stage: 5})] * 4
        run = _run(template, template, concurrency=4, adapters={"x": "/x", "y": "/y"})
        out += change.propose(v, rows, BASE, run, acts, vocab)["candidates"]
        big = [_act(m, **{**facts, "model_bytes": 70 * GIB}) for m in ("A", "B")]
        out += change.propose(v, rows, BASE, run, big, vocab)["candidates"]
    return out


@pytest.mark.vllm
def test_every_flag_and_env_var_the_tool_prints_exists_in_the_installed_vllm(vocab):
    """Against vLLM's own parser and ``vllm.envs``, read here and now (not the knobs cache)."""
    import vllm.envs as envs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from otel_ttft.runtime.instrumentor import VllmTTFTInstrumentor

    instrumentor = VllmTTFTInstrumentor()
    was_instrumented = instrumentor.is_instrumented_by_opentelemetry
    try:
        # vLLM's parser loads the general plugins, ours among them: it instruments this process.
        parser = make_arg_parser(FlexibleArgumentParser())
    finally:
        if not was_instrumented and instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()  # later tests start from an uninstrumented process
    assert instrumentor.is_instrumented_by_opentelemetry == was_instrumented
    flags = {s for a in parser._actions for s in a.option_strings}
    candidates = every_printable_change(vocab)
    ids = {c["id"] for c in candidates}
    assert ids >= {"compile-cache", "capture-sizes", "explicit-kv-size", "resident", "sleep",
                   "lora-slots", "prefetch", "kv-budget", "max-num-seqs", "prefix-caching",
                   "chunked-prefill"}, ids
    import inspect

    import torch._inductor.runtime.cache_dir_utils as cache_dir_utils

    torch_source = inspect.getsource(cache_dir_utils)
    for c in candidates:
        for arg in c["args"]:
            if arg.startswith("--"):
                assert arg.partition("=")[0] in flags, (c["id"], arg)
        for name in c["env"]:
            assert name in envs.environment_variables or name in torch_source, (c["id"], name)
        if c["id"] == "prefetch":
            assert "prefetch" in next(a for a in parser._actions if
                                      "--safetensors-load-strategy" in a.option_strings).choices


def test_a_restart_whose_compile_also_grew_offers_the_compile_cache_last(vocab):
    v = _verdict("cold-switch", "warmup", "warmup.process_start", "keep-resident",
                 compile_cache_hit=False)
    rows = [_row("cold-switch", ttft=100, model="B",
                 subs={"warmup.process_start": 60, "warmup.compile": 30})]
    ch = change.propose(v, rows, BASE, _run(), FITTING, vocab)
    assert _ids(ch) == ["resident", "sleep", "compile-cache"]
    assert [c["stage"] for c in ch["candidates"]] == [
        "warmup.process_start", "warmup.process_start", "warmup.compile"]
    rows[0]["substages"]["warmup.compile"] = 5  # 5 % of the increase: not worth a try
    assert _ids(change.propose(v, rows, BASE, _run(), FITTING, vocab)) == ["resident", "sleep"]


def test_a_wait_for_a_cpu_is_named_with_the_installed_vllms_cpu_binding_not_tried(vocab):
    v = _verdict("resident-dual", "prefill", semconv.STAGE_PREFILL_WAIT, "placement")
    rows = [_row("resident-dual", ttft=1.1, stages={"prefill": 1.05},
                 subs={semconv.STAGE_PREFILL_WAIT: 1.0})]
    ch = change.propose(v, rows, BASE, _run(), FITTING, vocab)
    (c,) = ch["candidates"]
    assert (c["id"], c["models"], c["args"], c["env"], c["stage"]) == (
        "cpu-placement", [], [], {}, semconv.STAGE_PREFILL_WAIT)
    binding = sorted(n for n in vocab.env if n.startswith("VLLM_CPU_") and "BIND" in n)
    assert binding and all(n in c["reason"] for n in binding)  # vLLM's own names
    assert "of 1 of 1 requests, 1.000 s" in c["reason"]
    # a scenario where some requests waited: how many, and how long, not a median of zero
    rows += [_row("resident-dual", ttft=0.01, stages={"prefill": 0.005}),
             _row("resident-dual", ttft=0.8, stages={"prefill": 0.75},
                  subs={semconv.STAGE_PREFILL_WAIT: 0.7})]
    (c,) = change.propose(v, rows, BASE, _run(), FITTING, vocab)["candidates"]
    assert "of 2 of 3 requests, 0.700 to 1.000 s" in c["reason"]
