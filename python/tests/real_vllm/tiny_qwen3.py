"""A tiny Qwen3 with random weights, for starting real ``vllm serve``
instances on a CPU in the project's tests. Made locally: no model hub.

Layout, as vLLM reads a Qwen3 model directory::

    config.json, generation_config.json, model.safetensors
    tokenizer.json, tokenizer_config.json

Two layers, two query heads and one KV head of 64 (vLLM's CPU attention has
no kernel for a head size of 16), hidden size 128, a byte-level tokenizer of
256 byte tokens and three special tokens. In float32 with ``--block-size 32``
one KV block holds 32 x 2 layers x (K, V) x 64 x 4 bytes = 32 KiB, so the
prefill -> decode transfer of a 167-token prompt moves 6 blocks, 196,608
bytes. Weights are drawn from a fixed seed: the same bytes on every run.
A random model seldom samples its end token; requests bound their length
(``max_tokens``) and set ``ignore_eos``.

    python tiny_qwen3.py DST      # builds DST unless its marker says it is current

Needs ``torch``, ``transformers`` and ``tokenizers`` (any vLLM environment
has them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

# Bumped whenever what `make` writes changes; a directory with another
# marker is rebuilt.
FORMAT_VERSION = 1
MARKER = ".edgemark-tiny-qwen3"
SEED = 20261206

HIDDEN = 128
HEAD_DIM = 64
LAYERS = 2
HEADS = 2
KV_HEADS = 1
SPECIAL_TOKENS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}
VOCAB = 320  # the byte tokens, the special tokens, unreachable filler


def model_config() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": SPECIAL_TOKENS["<|endoftext|>"],
        "eos_token_id": SPECIAL_TOKENS["<|im_end|>"],
        "pad_token_id": SPECIAL_TOKENS["<|endoftext|>"],
        "torch_dtype": "float32",
    }


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_tokenizer(dst: Path) -> None:
    """A byte-level BPE with no merges: one token per byte of UTF-8, so a
    prompt's length in tokens is its length in bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update(SPECIAL_TOKENS)
    taken = set(vocab.values())
    for tid in range(VOCAB):
        if tid not in taken:
            vocab[f"<unused{tid}>"] = tid
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {
            "id": tid,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for text, tid in sorted(SPECIAL_TOKENS.items(), key=lambda kv: kv[1])
    ]
    (dst / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
    _write_json(
        dst / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 4096,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
            "add_prefix_space": False,
            "errors": "replace",
            "split_special_tokens": False,
        },
    )


def write_model(dst: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3Config(**{k: v for k, v in model_config().items() if k not in ("architectures", "model_type")})
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(config).to(torch.float32)
    # transformers' init leaves small weights; a wider draw makes the
    # sampled tokens vary from prompt to prompt.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(str(dst), safe_serialization=True)
    _write_json(
        dst / "generation_config.json",
        {"bos_token_id": SPECIAL_TOKENS["<|endoftext|>"], "eos_token_id": SPECIAL_TOKENS["<|im_end|>"], "do_sample": False},
    )


def is_current(dst: str | os.PathLike) -> bool:
    try:
        return json.loads((Path(dst) / MARKER).read_text()).get("format") == FORMAT_VERSION
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def made(where: str | os.PathLike | None) -> Iterator[str]:
    """The tiny model's directory: built into `where` (kept there, reused
    by later runs), or, with `where` ``None``, into a temporary directory
    removed afterwards."""
    if where:
        yield str(make(where))
        return
    with tempfile.TemporaryDirectory(prefix="tiny-qwen3-") as tmp:
        yield str(make(os.path.join(tmp, "model")))


def make(dst: str | os.PathLike) -> Path:
    """Builds the tiny model in `dst` unless it is already there; returns `dst`."""
    dst = Path(dst)
    if is_current(dst):
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    import fcntl

    # One builder at a time; a second caller finds the model made.
    with open(dst.parent / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current(dst):
            _build(dst)
    return dst


def _build(dst: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=".tiny-qwen3-", dir=dst.parent))
    try:
        build = work / "model"
        build.mkdir()
        write_tokenizer(build)
        write_model(build)
        _write_json(build / MARKER, {"format": FORMAT_VERSION, "seed": SEED})
        for path in [build, *build.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if dst.exists():
            shutil.rmtree(dst)
        build.rename(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_qwen3.py DST")
    print(make(sys.argv[1]))
