"""Tiny but real checkpoints, built locally, so tests and the demo can run vLLM with no hub.

Random weights are enough: otel-ttft measures how vLLM reads, loads and warms a model, not what the
model says. One thing the weights do fix: the model never picks a token that carries no text of its
own (a special token, a byte of a character not yet whole, an id past the tokenizer): their output
rows are zero, so their logit 0 is never the greedy pick among ~2,000 random logits. Otherwise a
random model's first tokens sometimes stream no text, and the client's first content (its TTFT)
comes several tokens after the server's first token, differently from run to run.

Each checkpoint is split into several safetensors shards so that per-shard read spans have
something to show. Built once per cache directory (seconds) and reused afterwards.

- model A (``tiny-llama-v2``): Llama, 2 layers, hidden 128, multi-head attention.
- model B (``tiny-qwen2-v2``): Qwen2, 4 layers, hidden 192, grouped-query attention (2 KV heads),
  its own tokenizer: a switch A -> B changes weights, compiled graphs and the KV-cache layout.
- two LoRA adapters for A (PEFT files), for the adapter-switch scenario.
- a hybrid model (``tiny-llama-hybrid-v1``): Llama, 2 layers, hidden 512, about 35 MB in 16 MB
  shards, layer 0 a sliding window of 64 tokens and layer 1 full attention (Llama's
  ``layer_types``): vLLM gives it two KV-cache groups that share one allocation, as Gemma 2/3,
  gpt-oss and Llama 4 have.

Usage: ``python -m otel_ttft.tools.tiny_model [CACHE_DIR] [--which a|b|lora|hybrid|all]`` prints the
directories.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_ttft.runtime import environment_variables

MODEL_NAME = "tiny-llama-v2"  # bump when anything below changes: the cache is keyed by this name
MODEL_B_NAME = "tiny-qwen2-v2"  # the same rule for model B
HYBRID_NAME = "tiny-llama-hybrid-v1"  # the same rule for the hybrid model
HYBRID_WINDOW = 64  # tokens the hybrid model's sliding-window layer attends to
LORA_NAME = "tiny-llama-v2-lora-v1"  # directory holding the adapters for model A
LORA_ADAPTERS = ("lora-a", "lora-b")
LORA_RANK = 4
MARKER = ".complete"  # written last; a directory without it is never used
ENV_CACHE = environment_variables.OTEL_TTFT_CACHE
SEED = 0

VOCAB_SIZE = 2048
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4
MAX_POSITIONS = 2048
# The float32 checkpoint is about 3.4 MB; 1 MB shards give four files (at least two are required).
MAX_SHARD_SIZE = "1MB"
MIN_SHARDS = 2


@dataclass(frozen=True)
class ModelSpec:
    """What distinguishes one tiny checkpoint from another; ``name`` is its cache key."""

    name: str
    architecture: str  # LlamaForCausalLM | Qwen2ForCausalLM
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_shard_size: str
    seed: int
    #: per layer "sliding_attention" or "full_attention" (empty: every layer full attention)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None


SPEC_A = ModelSpec(MODEL_NAME, "LlamaForCausalLM", VOCAB_SIZE, HIDDEN_SIZE, INTERMEDIATE_SIZE,
                   NUM_LAYERS, NUM_HEADS, NUM_HEADS, MAX_SHARD_SIZE, SEED)
# About 10 MB in float32: larger than A and read from more shards.
SPEC_B = ModelSpec(MODEL_B_NAME, "Qwen2ForCausalLM", 3072, 192, 512, 4, 6, 2, "2MB", 1)
# About 35 MB in float32, in 16 MB shards: larger than a disk's readahead (8 MiB on the
# development VM), so a cold read of it faults pages in tensor by tensor.
SPEC_HYBRID = ModelSpec(HYBRID_NAME, "LlamaForCausalLM", VOCAB_SIZE, 512, 1536, NUM_LAYERS, 8, 8,
                        "16MB", SEED,
                        layer_types=("sliding_attention", "full_attention"),
                        sliding_window=HYBRID_WINDOW)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
_WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "token",
    "time", "first", "span", "trace", "model", "vllm", "prefill", "decode", "cache",
)


def default_cache_dir() -> Path:
    """``$OTEL_TTFT_CACHE``, else ``~/.cache/otel-ttft``: one place shared by tests, demo, CI."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "otel-ttft"


def checkpoint_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The safetensors shards of a model directory, in name order (the order vLLM reads them)."""
    return sorted(Path(model_dir).glob("*.safetensors"))


def ensure_tiny_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return ``<cache_dir>/tiny-llama-v2`` (model A), building it first if it is not there yet."""
    return _ensure(cache_dir, MODEL_NAME, lambda out: _build(out, SPEC_A))


def ensure_tiny_model_b(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return ``<cache_dir>/tiny-qwen2-v2`` (model B), building it first if needed."""
    return _ensure(cache_dir, MODEL_B_NAME, lambda out: _build(out, SPEC_B))


def ensure_tiny_hybrid_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return ``<cache_dir>/tiny-llama-hybrid-v1`` (sliding window + full attention)."""
    return _ensure(cache_dir, HYBRID_NAME, lambda out: _build(out, SPEC_HYBRID))


def ensure_lora_adapters(cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Two PEFT LoRA adapters for model A: ``{"lora-a": dir, "lora-b": dir}``."""
    base = ensure_tiny_model(cache_dir)
    root = _ensure(cache_dir, LORA_NAME, lambda out: _build_loras(out, base))
    return {name: root / name for name in LORA_ADAPTERS}


def _ensure(cache_dir: str | os.PathLike[str] | None, name: str,
            build: Callable[[Path], None]) -> Path:
    """Build ``<cache_dir>/<name>`` once.

    The build goes to a temporary directory beside the target and is renamed into place only when
    complete, so a crash or a concurrent builder never leaves a half-written model where vLLM would
    load it. A file lock keeps parallel test processes from building it twice.
    """
    parent = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = parent / name
    if (target / MARKER).is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(parent / f".{name}.lock"):
        if (target / MARKER).is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent))
        try:
            build(tmp)
            if target.exists():  # not ours (no marker): only a complete build may take the name
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    import fcntl  # POSIX only, like vLLM itself

    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(out: Path, spec: ModelSpec) -> None:
    """Write tokenizer, config and sharded weights into ``out``, then the marker."""
    # Heavy imports stay here: importing otel_ttft must stay cheap inside every vLLM process.
    import torch
    import transformers

    tokenizer = _train_tokenizer(spec)
    tokenizer.save_pretrained(out)
    if len(tokenizer) > spec.vocab_size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, model vocab is "
                           f"{spec.vocab_size}")

    arch = spec.architecture
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    config = config_cls(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype="float32",
        **({"layer_types": list(spec.layer_types), "sliding_window": spec.sliding_window}
           if spec.layer_types else {}),
    )
    # fork_rng: seed for reproducible weights without disturbing the caller's RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = getattr(transformers, arch)(config).to(torch.float32)
    with torch.no_grad():
        model.lm_head.weight[textless_ids(tokenizer, spec.vocab_size)] = 0.0
    with _no_progress_bars():
        model.save_pretrained(out, max_shard_size=spec.max_shard_size)

    shards = checkpoint_files(out)
    if len(shards) < MIN_SHARDS:
        raise RuntimeError(f"expected >= {MIN_SHARDS} shards, got {[s.name for s in shards]}")
    manifest = {
        "name": spec.name,
        "architecture": arch,
        "params": sum(p.numel() for p in model.parameters()),
        "shards": [s.name for s in shards],
        "checkpoint_bytes": sum(s.stat().st_size for s in shards),
    }
    (out / MARKER).write_text(json.dumps(manifest, indent=1) + "\n")
    _make_readable(out)


def textless_ids(tokenizer, vocab_size: int) -> list[int]:
    """Token ids that stream no text on their own: special tokens (skipped when decoding), bytes
    of a character not yet whole (the byte-level decoder holds or replaces them), and ids the
    tokenizer does not have."""
    out = []
    for token_id in range(vocab_size):
        text = (tokenizer.decode([token_id], skip_special_tokens=True)
                if token_id < len(tokenizer) else "")
        if not text or "\ufffd" in text:
            out.append(token_id)
    return out


def _build_loras(out: Path, base: Path) -> None:
    """PEFT-format adapters (adapter_config.json + adapter_model.safetensors) on q/v projections.

    Written directly (no peft dependency): vLLM reads exactly these two files. lora_B is non-zero
    so that the adapters really change the output.
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    for i, name in enumerate(LORA_ADAPTERS):
        adapter = out / name
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
            "r": LORA_RANK, "lora_alpha": 2 * LORA_RANK, "lora_dropout": 0.0, "bias": "none",
            "target_modules": ["q_proj", "v_proj"], "fan_in_fan_out": False,
            "modules_to_save": None, "use_rslora": False, "use_dora": False,
        }, indent=1) + "\n")
        generator = torch.Generator().manual_seed(100 + i)
        tensors = {}
        for layer in range(layers):
            for proj in ("q_proj", "v_proj"):
                key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(LORA_RANK, hidden,
                                                              generator=generator) * 0.02
                tensors[f"{key}.lora_B.weight"] = torch.randn(hidden, LORA_RANK,
                                                              generator=generator) * 0.02
        save_file(tensors, str(adapter / "adapter_model.safetensors"))
        _make_readable(adapter)
    (out / MARKER).write_text(json.dumps({"name": LORA_NAME, "adapters": LORA_ADAPTERS}) + "\n")
    _make_readable(out)


def _make_readable(root: Path) -> None:
    """mkdtemp and the shard writer create owner-only modes; vLLM may run as another user."""
    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for path in root.iterdir():
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _train_tokenizer(spec: ModelSpec = SPEC_A):  # -> PreTrainedTokenizerFast (lazy import)
    """Byte-level BPE trained on generated text: any string round-trips, no download needed.
    Each model's seed gives it its own corpus and vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(spec.seed)
    corpus = [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30))) for _ in range(5000)
    ]
    corpus += ["".join(chr(rng.randint(32, 126)) for _ in range(40)) for _ in range(2000)]

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    bos = _SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m otel_ttft.tools.tiny_model",
        description="Build (once) the tiny local models and print their directories.",
    )
    parser.add_argument(
        "cache_dir", nargs="?", default=None,
        help=f"parent directory (default: ${ENV_CACHE} or ~/.cache/otel-ttft)",
    )
    parser.add_argument("--which", choices=("a", "b", "lora", "hybrid", "all"), default="a")
    args = parser.parse_args(argv)
    if args.which in ("a", "all"):
        print(ensure_tiny_model(args.cache_dir))
    if args.which in ("b", "all"):
        print(ensure_tiny_model_b(args.cache_dir))
    if args.which in ("hybrid", "all"):
        print(ensure_tiny_hybrid_model(args.cache_dir))
    if args.which in ("lora", "all"):
        for path in ensure_lora_adapters(args.cache_dir).values():
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
