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
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

# The tokenizer and the cache both builders share (``../_tiny_model.py``).
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
import _tiny_model  # noqa: E402
from _tiny_model import write_json  # noqa: E402

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


def write_tokenizer(dst: Path) -> None:
    """A byte-level BPE with no merges: one token per byte of UTF-8, so a
    prompt's length in tokens is its length in bytes."""
    _tiny_model.write_byte_tokenizer(dst, SPECIAL_TOKENS, VOCAB, 4096)


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
    write_json(
        dst / "generation_config.json",
        {"bos_token_id": SPECIAL_TOKENS["<|endoftext|>"], "eos_token_id": SPECIAL_TOKENS["<|im_end|>"], "do_sample": False},
    )


def is_current(dst: str | os.PathLike) -> bool:
    return _tiny_model.is_current(dst, MARKER, FORMAT_VERSION)


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
    return _tiny_model.make(dst, MARKER, {"format": FORMAT_VERSION, "seed": SEED}, _write, "tiny-qwen3")


def _write(build: Path) -> None:
    write_tokenizer(build)
    write_model(build)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_qwen3.py DST")
    print(make(sys.argv[1]))
