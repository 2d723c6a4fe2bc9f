"""What the tiny-model builders of the real-server suites share
(``real_server/tiny_tts.py``: a Qwen3-TTS; ``real_vllm/tiny_qwen3.py``: a
Qwen3), written once: the byte-level text tokenizer, and a model made once
into a cache directory that several runs share (one builder at a time, the
directory published whole, with a marker that says which format it has).

Test support, standard library only at import (``tokenizers`` is imported
when a tokenizer is written). The builders put this directory on
``sys.path`` themselves: they also run as scripts with the Python of the
environment under test.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_byte_tokenizer(
    dst: Path, special_tokens: dict[str, int], size: int, model_max_length: int, words: tuple[str, ...] = ()
) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` of a byte-level BPE:
    one token per byte of UTF-8, each of `words` merged into one token,
    `special_tokens` at their own ids. The special tokens sit in the model's
    vocabulary (the added-token list alone would renumber them after the
    last byte token), and every other id below `size` is filled with a token
    no merge produces: a vocabulary with holes makes transformers print
    every missing id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    for word in words:
        piece = word[0]
        for ch in word[1:]:
            merges.append((piece, ch))
            piece += ch
            vocab.setdefault(piece, len(vocab))
    vocab.update(special_tokens)
    taken = set(vocab.values())
    for tid in range(size):
        if tid not in taken:
            vocab[f"<unused{tid}>"] = tid
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
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
        for text, tid in sorted(special_tokens.items(), key=lambda kv: kv[1])
    ]
    (dst / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
    write_json(
        dst / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model_max_length,
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


def is_current(dst: str | os.PathLike, marker: str, version: int) -> bool:
    """Whether `dst` holds a model of format `version` (its `marker` file
    says so)."""
    try:
        return json.loads((Path(dst) / marker).read_text()).get("format") == version
    except (OSError, ValueError):
        return False


def make(dst: str | os.PathLike, marker: str, stamp: dict, write: Callable[[Path], None], prefix: str) -> Path:
    """Builds a model in `dst` unless it is already there (its `marker`
    says format ``stamp["format"]``); returns `dst`. ``write(directory)``
    writes the model's files; the directory is then stamped (`marker`, with
    `stamp`), made readable to all, and put in place of `dst` whole."""
    dst = Path(dst)
    version = stamp["format"]
    if is_current(dst, marker, version):
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time; a second caller finds the model made.
    with open(dst.parent / f".{dst.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current(dst, marker, version):
            _publish(dst, marker, stamp, write, prefix)
    return dst


def _publish(dst: Path, marker: str, stamp: dict, write: Callable[[Path], None], prefix: str) -> None:
    work = Path(tempfile.mkdtemp(prefix=f".{prefix}-", dir=dst.parent))
    try:
        build = work / "model"
        build.mkdir()
        write(build)
        write_json(build / marker, stamp)
        for path in [build, *build.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if dst.exists():
            shutil.rmtree(dst)
        build.rename(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
