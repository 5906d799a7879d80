"""A tiny but real Llama checkpoint, built locally, so tests and the demo can run vLLM with no hub.

Random weights are enough: otel-ttft measures how vLLM reads, loads and warms a model, not what the
model says. The checkpoint is split into several safetensors shards so that per-shard read spans
have something to show. It is built once per cache directory (about 7 s) and reused afterwards.

Usage: ``python -m otel_ttft.tiny_model [CACHE_DIR]`` prints the model directory.
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
from collections.abc import Iterator, Sequence
from pathlib import Path

MODEL_NAME = "tiny-llama-v1"  # bump when anything below changes: the cache is keyed by this name
MARKER = ".complete"  # written last; a directory without it is never used
ENV_CACHE = "OTEL_TTFT_CACHE"
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
    """Return ``<cache_dir>/tiny-llama-v1``, building it first if it is not there yet.

    The build goes to a temporary directory beside the target and is renamed into place only when
    complete, so a crash or a concurrent builder never leaves a half-written model where vLLM would
    load it. A file lock keeps parallel test processes from building it twice.
    """
    parent = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = parent / MODEL_NAME
    if (target / MARKER).is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(parent / f".{MODEL_NAME}.lock"):
        if (target / MARKER).is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.", suffix=".tmp", dir=parent))
        try:
            _build(tmp)
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


def _build(out: Path) -> None:
    """Write tokenizer, config and sharded weights into ``out``, then the marker."""
    # Heavy imports stay here: importing otel_ttft must stay cheap inside every vLLM process.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(out)
    if len(tokenizer) > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, model vocab is {VOCAB_SIZE}")

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # fork_rng: seed for reproducible weights without disturbing the caller's RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config).to(torch.float32)
    with _no_progress_bars():
        model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)

    shards = checkpoint_files(out)
    if len(shards) < MIN_SHARDS:
        raise RuntimeError(f"expected >= {MIN_SHARDS} shards, got {[s.name for s in shards]}")
    manifest = {
        "name": MODEL_NAME,
        "params": sum(p.numel() for p in model.parameters()),
        "shards": [s.name for s in shards],
        "checkpoint_bytes": sum(s.stat().st_size for s in shards),
    }
    (out / MARKER).write_text(json.dumps(manifest, indent=1) + "\n")
    _make_readable(out)


def _make_readable(root: Path) -> None:
    """mkdtemp and the shard writer create owner-only modes; vLLM may run as another user."""
    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for path in root.iterdir():
        path.chmod(0o666 & ~umask)


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


def _train_tokenizer():  # -> PreTrainedTokenizerFast (transformers is imported lazily)
    """Byte-level BPE trained on generated text: any string round-trips, no download needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(SEED)
    corpus = [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30))) for _ in range(5000)
    ]
    corpus += ["".join(chr(rng.randint(32, 126)) for _ in range(40)) for _ in range(2000)]

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(_SPECIAL_TOKENS),
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
        prog="python -m otel_ttft.tiny_model",
        description="Build (once) the tiny local Llama model and print its directory.",
    )
    parser.add_argument(
        "cache_dir", nargs="?", default=None,
        help=f"parent directory (default: ${ENV_CACHE} or ~/.cache/otel-ttft)",
    )
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
