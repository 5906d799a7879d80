"""The rules behind ``change``: per recommendation, the candidates the evidence calls for and
the values computed from it (see ``change``'s docstring for what a candidate holds)."""

from __future__ import annotations

import math
import re
import shlex

from otel_ttft import semconv
from otel_ttft.diagnosis import compile_fix
from otel_ttft.diagnosis.change_evidence import (
    CHAT_ROUTE,
    FILL_CACHE,
    SIDE_CLIENT,
    SIDE_DRIVER,
    WARM_PREFIX,
    Builder,
    Evidence,
    median,
)
from otel_ttft.diagnosis.rule import (
    KEEP_RESIDENT,
    MATERIAL_SHARE,
    PERSIST_ARTIFACTS,
    PLACEMENT,
    TUNE_ADMISSION,
    TUNE_CONTEXT,
    WARM_UP,
)

FIT_SHARE = 0.9  # both models fit when their weights and KV take at most this much of the device
HOST_SHARE = 0.8  # sleep level 1 when the sleeping weights take at most this much of host RAM
GPU_HEADROOM = 1.25  # per server on a GPU: weights + KV, times this, as its memory fraction


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


# --- the rules, one per recommendation ----------------------------------------------------------
def _persist(b: Builder) -> None:
    ev = b.ev
    sub = ev.substage
    if sub == semconv.STAGE_WARMUP_GRAPH_CAPTURE:
        sizes = sorted({1, *[2 ** i for i in range(1, 16) if 2 ** i <= ev.concurrency],
                        ev.concurrency})
        seen = ev.own.get("graph_batch_sizes") or []
        b.add("capture-sizes",
              f"graph capture took {ev.p50(sub):.1f} s for {len(seen) or 'its'} batch sizes; "
              f"the replay ran at most {ev.concurrency} requests at once, so capture only "
              f"{', '.join(map(str, sizes))}",
              args=["--cudagraph-capture-sizes", *map(str, sizes)], gpu_only=True,
              stage=semconv.STAGE_WARMUP_GRAPH_CAPTURE)
    if sub in (semconv.STAGE_WARMUP_COMPILE, semconv.STAGE_WARMUP_GRAPH_CAPTURE):
        _compile_cache(b)
    if sub == semconv.STAGE_WARMUP_PROFILE:
        kv = ev.own.get("kv_bytes") or ev.own.get("available_kv_bytes")
        if kv:
            b.add("explicit-kv-size",
                  f"the profile run took {ev.p50(sub):.1f} s to size a KV cache that came out "
                  f"{_gib(kv)}: state that size ({kv} bytes) and the profiling run has less "
                  f"to find", args=["--kv-cache-memory-bytes", str(int(kv))])


def _compile_cache(b: Builder) -> None:
    ev = b.ev
    vocab = ev.vocab
    root = (vocab.env_defaults.get("VLLM_CACHE_ROOT") if vocab else None) or "~/.cache/vllm"
    env = {"VLLM_CACHE_ROOT": root}
    if vocab is None or "TORCHINDUCTOR_CACHE_DIR" in vocab.torch_env:
        env["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
    hit = ev.verdict.get("evidence", {}).get("compile_cache_hit")
    where = ev.own.get("compile_cache_dir")
    # the live verdict read the cache before the start compiled: say what happened to it
    seen = compile_fix.explain(ev.own.get("compile_cache"), vocab, earlier_start=True)
    if seen is not None:
        root = ev.own["compile_cache"].get("root") or root
        env = {"VLLM_CACHE_ROOT": root}
    b.add("compile-cache",
          f"torch.compile took {ev.p50(semconv.STAGE_WARMUP_COMPILE):.1f} s and "
          f"{'missed' if hit is False else 'did not hit'} the cache"
          + (f": {seen[0]}; {seen[1]}" if seen is not None else
             (f" ({where}: this start's own)" if where else "")
             + "; a durable cache kept across starts and switches lets the next start load "
               "what an earlier one compiled (one start fills it)"),
          env=env, durable=list(env), prepare=FILL_CACHE, stage=semconv.STAGE_WARMUP_COMPILE)


def _keep_resident(b: Builder) -> None:
    ev = b.ev
    sub = ev.substage
    if sub == semconv.STAGE_WARMUP_ADAPTER:
        _lora_slots(b)
        return
    driver = ev.run.get("driver") or ev.setup.get("driver")
    fits, fit_reason, util = _fits(ev)
    names = list(ev.targets) or ([ev.model] if ev.model else [])
    gpu = ev.own.get("device_type") == "cuda"
    util_args = ["--gpu-memory-utilization", f"{util:.2f}"] if gpu and util else []
    resident = sleep = None
    if driver not in ("resident",) and fits is not False:
        resident = b.add("resident", f"{fit_reason}: keep every model's server up and route by "
                         "model name, so no request waits for a switch or a start",
                         side=SIDE_DRIVER, driver="resident", models=names, args=util_args)
    if driver not in ("sleep", "resident"):
        level, level_reason = _sleep_level(ev)
        sleep = b.add("sleep", f"{'both do not fit' if fits is False else 'a lighter switch'}: "
                      f"sleep the outgoing model instead of stopping it ({level_reason})",
                      side=SIDE_DRIVER, driver="sleep", models=names,
                      args=["--enable-sleep-mode", *util_args],
                      env={"VLLM_SERVER_DEV_MODE": "1"}, gpu_only=True, sleep_level=level)
    if fits is False and sleep is not None:  # the one that can work first
        b.candidates.sort(key=lambda c: c is not sleep)
    if resident is None and sleep is None:
        b.add("route-by-memory", f"driver {driver} already keeps the servers up; the switch "
              "happens elsewhere (the router or the host): route by which model is in memory",
              side=SIDE_DRIVER, models=[])
    if sub == semconv.STAGE_LOAD_READ:
        _loader(b)
    if _compile_also_grew(ev):  # the next candidate: the restart stays, its compile goes
        _compile_cache(b)


def _compile_also_grew(ev: Evidence) -> bool:
    """A start-up whose compile missed the cache and took a material share of the increase."""
    if ev.verdict.get("evidence", {}).get("compile_cache_hit") is True:
        return False
    key = semconv.STAGE_WARMUP_COMPILE
    increase = median(r["client_ttft_s"] for r in ev.rows) - median(
        r["client_ttft_s"] for r in ev.base_rows)
    grew = ev.p50(key) - ev.p50(key, ev.base_rows)
    return increase > 0 and grew >= MATERIAL_SHARE * increase


def _fits(ev: Evidence) -> tuple[bool | None, str, float | None]:
    """Both (all) models' measured weights + KV against the device memory."""
    need = {}
    for name in ev.targets or {ev.model: None}:
        f = ev.facts.get(name) or {}
        weights = f.get("model_bytes") or f.get("bytes_read")
        if weights and f.get("kv_bytes"):
            need[name] = weights + f["kv_bytes"]
    device = max((f.get("device_memory_bytes") or 0 for f in ev.facts.values()), default=0)
    if not device or len(need) < max(len(ev.targets), 1):
        return None, "memory not measured for every model (weights, KV, device)", None
    total = sum(need.values())
    fits = total <= FIT_SHARE * device
    parts = " + ".join(f"{n} {_gib(v)}" for n, v in need.items())
    reason = (f"weights + KV {parts} = {_gib(total)} {'fit in' if fits else 'exceed'} "
              f"{FIT_SHARE:.0%} of the device's {_gib(device)}")
    util = max(need.values()) * GPU_HEADROOM / device
    return fits, reason, math.ceil(min(util, FIT_SHARE / max(len(need), 1)) * 100) / 100


def _sleep_level(ev: Evidence) -> tuple[int, str]:
    weights = sum((f.get("model_bytes") or f.get("bytes_read") or 0)
                  for name, f in ev.facts.items() if name != ev.target_name)
    host = max((f.get("host_memory_bytes") or 0 for f in ev.facts.values()), default=0)
    if host and weights and weights <= HOST_SHARE * host:
        return 1, (f"level 1 offloads the sleeping weights ({_gib(weights)}) to host RAM "
                   f"({_gib(host)})")
    if host and weights:
        return 2, f"level 2: the sleeping weights ({_gib(weights)}) do not fit host RAM"
    return 1, "level 1: host memory not measured"


def _lora_slots(b: Builder) -> None:
    ev = b.ev
    adapters = len(ev.setup.get("adapters") or {}) or len(
        {r["model"] for r in ev.rows if r.get("model")})
    current = ev.template_value("max_loras")
    slots = max(adapters, 2)
    b.add("lora-slots", f"an adapter load took {ev.p50(semconv.STAGE_WARMUP_ADAPTER):.2f} s "
          f"inside the request; {adapters} adapters share "
          f"{current or 'the default number of'} slots: one slot per adapter keeps them loaded",
          args=["--max-loras", str(slots), "--max-cpu-loras", str(slots)])


_PAGE_CACHE_COLD = 0.5  # below this share resident before the read, the read came from storage
_SHOWN_FILES = 8  # checkpoint files named in a command (the rest counted)


def _page_cache(b: Builder, ratio: float | None) -> None:
    """The checkpoint came from storage: read its exact files into the page cache before the
    start, with the figures that chose it."""
    ev = b.ev
    files = [f for f in ev.own.get("shard_paths") or [] if isinstance(f, str)]
    if ratio is None or ratio >= _PAGE_CACHE_COLD or not files:
        return
    seconds = ev.p50(semconv.STAGE_LOAD_READ)
    size = ev.own.get("bytes_read") or 0
    per_s = size / seconds if size and seconds > 0 else 0.0
    rate = (f" at {per_s / 1e9:.2f} GB/s" if per_s >= 1e8 else
            f" at {per_s / 1e6:.2f} MB/s" if per_s else "")
    shown = " ".join(shlex.quote(f) for f in files[:_SHOWN_FILES])
    more = f" (and {len(files) - _SHOWN_FILES} more files)" if len(files) > _SHOWN_FILES else ""
    b.add("page-cache-warm",
          f"the checkpoint was {ratio:.0%} in the page cache before its read and "
          f"{_gib(size) if size else 'its bytes'} came from storage{rate} in "
          f"{seconds:.1f} s: read its files into the page cache before the start "
          f"(vmtouch -t {shown}, or cat {shown} > /dev/null){more}; or faster storage for "
          f"the model directory", side=SIDE_DRIVER, models=[], stage=semconv.STAGE_LOAD_READ)


def _loader(b: Builder) -> None:
    ev, vocab = b.ev, b.ev.vocab
    ratio = ev.verdict.get("evidence", {}).get("page_cache_resident_ratio_p50")
    cold = f" (page cache {ratio:.0%} resident before the read)" if ratio is not None else ""
    _page_cache(b, ratio)
    strategy = vocab.choices("--safetensors-load-strategy") if vocab else ()
    if "prefetch" in strategy and ev.template_value("safetensors_load_strategy") != "prefetch":
        b.add("prefetch", f"checkpoint reads took {ev.p50(semconv.STAGE_LOAD_READ):.1f} s"
              f"{cold}: prefetch the shards ahead of the reader",
              args=["--safetensors-load-strategy", "prefetch"], stage=semconv.STAGE_LOAD_READ)
    formats = vocab.load_formats if vocab else ()
    for fmt, package in (("runai_streamer", "runai_model_streamer"),
                         ("fastsafetensors", "fastsafetensors")):
        if fmt in formats:
            installed = vocab.loader_packages.get(package) if vocab else None
            c = b.add(f"loader-{fmt}", f"stream the checkpoint ({fmt} loader)"
                      + ("" if installed else f"; needs the {package} package installed"),
                      args=["--load-format", fmt], stage=semconv.STAGE_LOAD_READ)
            if not installed:
                c["missing"].append(package)
    if ratio is None:  # nothing says whether it came from storage or from memory
        b.add("measure-read", f"checkpoint reads took {ev.p50(semconv.STAGE_LOAD_READ):.1f} s, "
              "and no page-cache residency was measured for its shards: the measurement that "
              "decides between the page cache, the loader and the storage is the shard spans' "
              "residency before the read (otel-ttft doctor: which --load-format has per-shard "
              "spans)", side=SIDE_DRIVER, models=[], stage=semconv.STAGE_LOAD_READ)


def _tune_admission(b: Builder) -> None:
    ev = b.ev
    f = ev.own
    c = ev.concurrency
    seqs = ev.template_value("max_num_seqs")
    seqs = int(seqs) if isinstance(seqs, (str, int)) and str(seqs).isdigit() else None
    blocks, block_size, kv_bytes = f.get("kv_blocks"), f.get("kv_block_size"), f.get("kv_bytes")
    tokens = ev.prompt_tokens + ev.max_tokens
    if ev.substage == semconv.STAGE_WARMUP_KV_ALLOC:
        if blocks and block_size and kv_bytes:
            need = c * request_blocks(f, tokens, block_size)
            size = int(need * kv_bytes / blocks)
            b.add("kv-budget", f"allocating {blocks} KV blocks ({_gib(kv_bytes)}) took "
                  f"{ev.p50(ev.substage):.2f} s; {c} requests of {tokens} tokens need {need}",
                  args=["--kv-cache-memory-bytes", str(size)])
        return
    slots_short = seqs is not None and c > seqs
    if slots_short:
        b.add("max-num-seqs", f"{c} requests arrived at once but the server admits "
              f"{seqs} sequences at a time (--max-num-seqs)",
              args=["--max-num-seqs", str(c)])
    if blocks and block_size:
        per = request_blocks(f, tokens, block_size)
        need = c * per
        if need > blocks:
            groups = int(f.get("kv_groups") or 1)
            reason = (f"{c} concurrent requests of {tokens} tokens (prompt p50 + max_tokens) "
                      f"need {c} x {per} = {need} KV blocks of {block_size} tokens"
                      + (f" (over its {groups} KV-cache groups)" if groups > 1 else "")
                      + f"; the server had {blocks}")
            if ev.server is not None and ev.server.sets("num_gpu_blocks_override"):
                b.add("kv-budget", reason, args=["--num-gpu-blocks-override", str(need)])
            elif kv_bytes:
                b.add("kv-budget", reason,
                      args=["--kv-cache-memory-bytes", str(math.ceil(need * kv_bytes / blocks))])
    if not b.candidates and seqs is None and c > 1:
        b.add("max-num-seqs", f"{c} requests arrived at once; admit them together",
              args=["--max-num-seqs", str(c)])


def request_blocks(facts: dict, tokens: int, block_size: int) -> int:
    """KV blocks one request of ``tokens`` takes from the pool every group draws from: one per
    ``block_size`` tokens in each group that keeps the whole sequence (full attention), at most
    the window's in the others (sliding windows, Mamba state). A record without the groups is
    one group; one with groups but not their kinds counts each as keeping the sequence."""
    per = math.ceil(tokens / block_size)
    groups = max(int(facts.get("kv_groups") or 1), 1)
    sequence = facts.get("kv_sequence_groups")
    if sequence is None:
        return per * groups
    windows = groups - int(sequence)
    return int(sequence) * per + min(int(facts.get("kv_window_blocks") or 0), windows * per)


def _tune_context(b: Builder) -> None:
    ev = b.ev
    tokens, base = ev.prompt_tokens, int(median(
        r["prompt_tokens"] for r in ev.base_rows if r.get("prompt_tokens")))
    prompts = [r.get("prompt") for r in ev.rows]
    repeated = len(prompts) > len(set(prompts))
    caching = ev.template_value("enable_prefix_caching")
    # what the replay recorded its prompts share (none: a numbered long prompt); older runs: -1
    kinds = ev.run.get("prompts") if isinstance(ev.run.get("prompts"), dict) else {}
    shared = (kinds.get(prompts[0]) or {}).get("shared_prefix_tokens", -1) if prompts else -1
    if repeated and caching is False and shared != 0:
        sent = (f"{len(prompts)} prompts sharing a {shared}-token prefix were sent"
                if isinstance(shared, int) and shared > 0 else
                f"the same {tokens}-token prompt was sent {len(prompts)} times")
        b.add("prefix-caching", f"{sent} with prefix caching off: its repeats can reuse the "
              "cached prefix", args=["--enable-prefix-caching"])
    chunk = ev.template_value("max_num_batched_tokens")
    chunk = int(chunk) if isinstance(chunk, str) and chunk.isdigit() else None
    limit = int(ev.setup.get("max_model_len") or 0) or None
    if chunk and tokens > chunk:
        size = min(math.ceil(tokens / 256) * 256, limit or tokens)
        if size > chunk:
            b.add("chunked-prefill", f"a {tokens}-token prompt is prefilled in "
                  f"{math.ceil(tokens / chunk)} chunks of {chunk} tokens "
                  "(--max-num-batched-tokens): a larger chunk takes it in fewer steps",
                  args=["--max-num-batched-tokens", str(size)])
    b.add("shorter-context", f"prompts of {tokens} tokens against {base} in the baseline: "
          "shorter history or retrieval on the client side (named, not tried)", side=SIDE_CLIENT,
          models=[])


# The installed vLLM's own variables that say which CPUs a worker runs on ("its CPU binding").
_CPU_BINDING = re.compile(r"^VLLM_CPU_.*(BIND|RESERVED)")


def _placement(b: Builder) -> None:
    """The worker waited for a CPU inside its prefill steps: move it, or what it shares the CPUs
    with, apart. Named, not tried: which CPUs are free is the host's, not the trace's."""
    ev = b.ev
    waits = [(r.get("substages") or {}).get(semconv.STAGE_PREFILL_WAIT, 0.0) for r in ev.rows]
    named = sorted(w for w in waits if w > 0)
    names = sorted(n for n in (ev.vocab.env if ev.vocab else ()) if _CPU_BINDING.match(n))
    where = (" (" + ", ".join(names) + ")") if names else ""
    how_long = (f"{named[-1]:.3f} s" if len(named) == 1 else
                f"{named[0]:.3f} to {named[-1]:.3f} s") if named else "0 s"
    b.add("cpu-placement", f"EngineCore or its worker waited for a CPU inside the prefill steps "
          f"of {len(named)} of {len(waits)} requests, {how_long} (on the kernel's run queue, or "
          f"its thread ran for less than the step's wall time): give each server CPUs of its "
          f"own{where}, or move what else runs there", models=[],
          stage=semconv.STAGE_PREFILL_WAIT)


def _warm_up(b: Builder) -> None:
    """The cold prefix cache (``prefill.uncached_prefix``): warm the shared prefix once after
    activation, or keep the server (and its cache) resident. A compile on first use inside a
    step (``warmup.step_compile``): one request as users send them after activation. Other
    warm-ups: nothing computed."""
    ev = b.ev
    if ev.substage == semconv.STAGE_WARMUP_STEP_COMPILE:
        _first_use_warm_up(b)
        return
    if ev.substage != semconv.STAGE_PREFILL_UNCACHED_PREFIX:
        return
    evidence = ev.verdict.get("evidence") or {}
    tokens = evidence.get("uncached_prefix_tokens_p50") or 0
    share = evidence.get("baseline_cached_share_p50")
    seconds = ev.p50(ev.substage)
    vocab = ev.vocab
    routes = vocab.routes if vocab is not None else frozenset()
    where = (f"POST {CHAT_ROUTE} with max_tokens 1" if CHAT_ROUTE in routes
             else "one completion request with max_tokens 1")
    b.add("prefix-warm-up",
              f"{tokens:g} prompt tokens the baseline read from vLLM's prefix cache"
              + (f" ({share:.0%} of its prompt)" if share is not None else "")
              + f" were computed after the switch, {seconds:.2f} s of prefill: send the shared "
                f"prefix (system prompt, history) once after activation ({where}) before "
                "routing users", side=SIDE_DRIVER, prepare=WARM_PREFIX)
    clears = vocab.sleep_clears_prefix_cache_from if vocab is not None else None
    sleep = (f"; vLLM's engine clears the prefix cache when it sleeps at level {clears} or "
             f"above (EngineCore.sleep), so sleep mode does not keep it" if clears is not None
             else "")
    driver = ev.setup.get("driver") or ev.run.get("driver")
    if driver in ("restart", "sleep", "proxy"):
        b.add("resident", f"driver {driver} starts or wakes the model with an empty prefix "
              f"cache; resident servers keep theirs{sleep}", side=SIDE_DRIVER,
              driver="resident", models=list(ev.targets) or ([ev.model] if ev.model else []))


def _first_use_warm_up(b: Builder) -> None:
    ev = b.ev
    seconds = ev.p50(semconv.STAGE_WARMUP_STEP_COMPILE)
    sampling = ev.run.get("sampling")
    logprobs = sampling.get("logprobs") if isinstance(sampling, dict) else None
    asks = (f" (they ask for {logprobs} logprobs per token)"
            if isinstance(logprobs, int) and logprobs > 0 else "")
    b.add("first-use-warm-up",
              f"vLLM compiled on first use inside a request's step, {seconds:.2f} s that the "
              f"start-up's warm-up did not reach: send one request as users send them"
              f"{asks} after each activation, before routing users (the request span's "
              f"torch.compile child names what compiled: ttft.compile.frame)",
              side=SIDE_DRIVER, prepare=WARM_PREFIX, stage=semconv.STAGE_WARMUP_STEP_COMPILE)


RULES = {PERSIST_ARTIFACTS: _persist, KEEP_RESIDENT: _keep_resident,
         TUNE_ADMISSION: _tune_admission, TUNE_CONTEXT: _tune_context, PLACEMENT: _placement,
         WARM_UP: _warm_up}
