"""The tiny local model every vLLM test loads: sharded, with a working tokenizer, built once."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from otel_ttft.tools import tiny_model

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cache = tmp_path_factory.mktemp("otel-ttft-cache")
    return cache, tiny_model.ensure_tiny_model(cache)


def _tensor_bytes(shard: Path) -> int:
    """Bytes of tensor data in one safetensors file, from its header (8-byte length + JSON)."""
    with shard.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items()
               if k != "__metadata__")


def test_layout(built: tuple[Path, Path]) -> None:
    cache, model_dir = built
    assert model_dir == cache / tiny_model.MODEL_NAME
    assert (model_dir / tiny_model.MARKER).is_file()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
        128, 2, 2048,
    )
    # No temporary build directory is left beside the model.
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [tiny_model.MODEL_NAME]


def test_checkpoint_is_sharded_and_complete(built: tuple[Path, Path]) -> None:
    _, model_dir = built
    shards = tiny_model.checkpoint_files(model_dir)
    assert len(shards) >= 2
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert {Path(f).name for f in index["weight_map"].values()} == {s.name for s in shards}
    # Tensor bytes across the shards add up to the checkpoint's declared total ...
    assert sum(_tensor_bytes(s) for s in shards) == index["metadata"]["total_size"]
    # ... and the files on disk add up to what the build recorded.
    manifest = json.loads((model_dir / tiny_model.MARKER).read_text())
    assert sum(s.stat().st_size for s in shards) == manifest["checkpoint_bytes"]
    assert manifest["shards"] == [s.name for s in shards]


def test_tokenizer_round_trips_and_has_chat_template(built: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    _, model_dir = built
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "the first token was slow: 42 ms! ünïcode"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert all(0 <= i < 2048 for i in ids)
    assert tok.decode(ids, skip_special_tokens=True) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "user: hello\nassistant:"


def test_second_call_reuses_the_model(built: tuple[Path, Path]) -> None:
    cache, model_dir = built
    marker = model_dir / tiny_model.MARKER
    before = marker.stat().st_mtime_ns
    shard_mtimes = [s.stat().st_mtime_ns for s in tiny_model.checkpoint_files(model_dir)]
    assert tiny_model.ensure_tiny_model(cache) == model_dir
    assert marker.stat().st_mtime_ns == before
    assert [s.stat().st_mtime_ns for s in tiny_model.checkpoint_files(model_dir)] == shard_mtimes


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(tiny_model.ENV_CACHE, str(tmp_path))
    assert tiny_model.default_cache_dir() == tmp_path
    monkeypatch.delenv(tiny_model.ENV_CACHE)
    assert tiny_model.default_cache_dir() == Path.home() / ".cache" / "otel-ttft"


def test_incomplete_directory_is_replaced(tmp_path: Path) -> None:
    """A directory without the marker (not ours, or from an older crash) is never trusted."""
    stale = tmp_path / tiny_model.MODEL_NAME
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    model_dir = tiny_model.ensure_tiny_model(tmp_path)
    assert model_dir == stale
    assert (model_dir / tiny_model.MARKER).is_file()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"


def test_model_b_differs_in_architecture_kv_layout_and_tokenizer(built) -> None:
    cache, model_a = built
    model_b = tiny_model.ensure_tiny_model_b(cache)
    assert model_b == cache / tiny_model.MODEL_B_NAME and (model_b / tiny_model.MARKER).is_file()
    a = json.loads((model_a / "config.json").read_text())
    b = json.loads((model_b / "config.json").read_text())
    assert b["architectures"] == ["Qwen2ForCausalLM"] != a["architectures"]
    assert (b["num_hidden_layers"], b["num_key_value_heads"]) != (
        a["num_hidden_layers"], a["num_key_value_heads"])
    assert len(tiny_model.checkpoint_files(model_b)) > len(tiny_model.checkpoint_files(model_a))
    assert (model_b / "tokenizer.json").read_bytes() != (model_a / "tokenizer.json").read_bytes()


def test_lora_adapters_are_peft_files_for_model_a(built) -> None:
    from safetensors import safe_open

    cache, model_a = built
    adapters = tiny_model.ensure_lora_adapters(cache)
    assert list(adapters) == list(tiny_model.LORA_ADAPTERS)
    hidden = json.loads((model_a / "config.json").read_text())["hidden_size"]
    weights = []
    for path in adapters.values():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["r"] == tiny_model.LORA_RANK
        with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
            assert keys and all(k.startswith("base_model.model.model.layers.") for k in keys)
            a = f.get_tensor(next(k for k in keys if k.endswith("lora_A.weight")))
            assert tuple(a.shape) == (tiny_model.LORA_RANK, hidden)
            weights.append(a)
    assert not (weights[0] == weights[1]).all()  # two different adapters


def test_every_greedy_token_streams_text(built: tuple[Path, Path]) -> None:
    """A random model that picks a special token or half a character streams no text for it,
    and the client's first content then lags the server's first token: the tiny model never
    does (greedy decoding over random prompts, the model's own forward pass)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, model_dir = built
    tok = AutoTokenizer.from_pretrained(model_dir)
    textless = set(tiny_model.textless_ids(tok, tiny_model.VOCAB_SIZE))
    assert {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} <= textless
    assert tok("the quick")["input_ids"][1] not in textless  # words stream text
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rng = random.Random(3)
    prompts = torch.tensor([[tok.bos_token_id] + [rng.randrange(4, len(tok)) for _ in range(24)]
                            for _ in range(64)])
    with torch.no_grad():
        picks = model(prompts).logits.argmax(-1)  # the greedy pick after every prefix
    assert not textless & set(picks.flatten().tolist())
    assert len(set(picks.flatten().tolist())) > 50  # still a random model, not one token
