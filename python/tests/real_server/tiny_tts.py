"""A tiny Qwen3-TTS checkpoint with random weights, for starting a real
``vllm-omni serve`` on a CPU in the project's tests.

Layout, as vLLM-Omni reads a Qwen3-TTS CustomVoice model directory::

    config.json, generation_config.json, model.safetensors   the talker
    tokenizer.json, tokenizer_config.json                     text tokenizer
    speech_tokenizer/{config.json, model.safetensors,
                      preprocessor_config.json}               the 12 Hz codec

The talker's parameter names and shapes come from the Hugging Face model
code of the ``qwen-tts`` package, fetched from the package registry into a
temporary directory while the model is made (``QWEN_TTS_WHEEL`` may name a
wheel already at hand); only its configuration and modeling modules are
loaded. The codec is built with vLLM-Omni's own classes, so this must run
with the Python of an environment that has vLLM-Omni installed.

The text tokenizer is byte-level with Qwen's special tokens at their real
ids, plus ``assistant`` and ``user`` as single tokens: vLLM-Omni counts the
prompt template (``<|im_start|>assistant\\n`` ...) in tokens.

Weights are drawn from a fixed seed; a random model never samples its codec
end token, so every request must bound its length (``max_new_tokens``).

    python tiny_tts.py DST      # builds DST unless its marker says it is current
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

# The tokenizer and the cache both builders share (``../_tiny_model.py``).
_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
import _tiny_model  # noqa: E402
from _tiny_model import write_json  # noqa: E402

# Bumped whenever what `make` writes changes; a directory with another
# marker is rebuilt.
FORMAT_VERSION = 2
MARKER = ".edgemark-tiny-tts"
QWEN_TTS_VERSION = "0.1.1"
SEED = 20240917

SPEAKERS = {"ryan": 3061, "vivian": 3065, "serena": 3066, "aiden": 2861}
LANGUAGES = {"english": 2050, "chinese": 2055, "german": 2053, "french": 2061}

HIDDEN = 128
HEAD_DIM = 64
TEXT_HIDDEN = 64
TEXT_VOCAB = 151936
CODEC_VOCAB = 3072
CODEBOOK = 2048
CODE_GROUPS = 16
CODEC_EOS = 2150  # the pipeline's stop token for stage 0

# Qwen's special tokens at the ids the Qwen3-TTS config names.
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
    "<tts_text_bos_single>": 151674,
    "<|audio_pad|>": 151675,
}
WORDS = ("assistant", "user")


def _rope_scaling() -> dict:
    # Qwen3-TTS's interleaved multimodal RoPE, its sections scaled to HEAD_DIM.
    half = HEAD_DIM // 2
    first = half - 2 * (half * 20 // 64)
    return {"interleaved": True, "mrope_section": [first, half * 20 // 64, half * 20 // 64], "rope_type": "default"}


def model_config() -> dict:
    code_predictor = {
        "model_type": "qwen3_tts_talker_code_predictor",
        "vocab_size": CODEBOOK,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "num_code_groups": CODE_GROUPS,
        "layer_types": ["full_attention"],
        "use_cache": True,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
    }
    talker = {
        "model_type": "qwen3_tts_talker",
        "code_predictor_config": code_predictor,
        "vocab_size": CODEC_VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": _rope_scaling(),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "tie_word_embeddings": False,
        "num_code_groups": CODE_GROUPS,
        "text_hidden_size": TEXT_HIDDEN,
        "text_vocab_size": TEXT_VOCAB,
        "position_id_per_seconds": 13,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": CODEC_EOS,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_language_id": dict(LANGUAGES),
        "spk_id": dict(SPEAKERS),
        "spk_is_dialect": {name: False for name in SPEAKERS},
    }
    speaker_encoder = {
        "mel_dim": 128,
        "enc_dim": HIDDEN,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 16,
        "enc_res2net_scale": 8,
        "enc_se_channels": 16,
        "sample_rate": 24000,
    }
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "tiny",
        "tts_model_type": "custom_voice",
        "im_start_token_id": SPECIAL_TOKENS["<|im_start|>"],
        "im_end_token_id": SPECIAL_TOKENS["<|im_end|>"],
        "tts_pad_token_id": SPECIAL_TOKENS["<tts_pad>"],
        "tts_bos_token_id": SPECIAL_TOKENS["<tts_text_bos>"],
        "tts_eos_token_id": SPECIAL_TOKENS["<tts_text_eod>"],
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        # As the released checkpoints; without it transformers 5 takes the
        # directory's tokenizer for a Mistral one and warns.
        "transformers_version": "4.57.3",
    }


def speech_tokenizer_config() -> dict:
    encoder = {
        # transformers' Mimi, shrunk; 24 kHz in, 12.5 frames a second.
        "model_type": "mimi",
        "sampling_rate": 24000,
        "audio_channels": 1,
        "hidden_size": 64,
        "num_filters": 8,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": CODEBOOK,
        "codebook_dim": 64,
        "num_quantizers": 32,
        "num_semantic_quantizers": 1,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 64,
        "upsample_groups": 64,
        "num_hidden_layers": 1,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "initializer_range": 0.02,
        "norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_window": 250,
        "attention_dropout": 0.0,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        "use_streaming": False,
    }
    decoder = {
        "codebook_size": CODEBOOK,
        "codebook_dim": 64,
        "hidden_size": 64,
        "latent_dim": 64,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "attention_bias": False,
        # The deploy file's codec_left_context_frames must match this window.
        "sliding_window": 72,
        "intermediate_size": 128,
        "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-5,
        "num_hidden_layers": 1,
        "num_quantizers": CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
        "attention_dropout": 0.0,
    }
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": encoder,
        "decoder_config": decoder,
        "encoder_valid_num_quantizers": CODE_GROUPS,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }


PREPROCESSOR = {
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
    "chunk_length_s": None,
    "overlap": None,
}


# ---------------------------------------------------------------- tokenizer


def write_tokenizer(dst: Path) -> None:
    _tiny_model.write_byte_tokenizer(dst, SPECIAL_TOKENS, max(SPECIAL_TOKENS.values()), 32768, WORDS)


# ------------------------------------------------------------------- talker


def _qwen_tts_wheel(tmp: Path) -> Path:
    given = os.environ.get("QWEN_TTS_WHEEL")
    if given:
        return Path(given)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "-d", str(tmp), f"qwen-tts=={QWEN_TTS_VERSION}",
        ],
        check=True,
    )
    return next(tmp.glob("qwen_tts-*.whl"))


def _load_qwen_tts_models(tmp: Path):
    """The wheel's `qwen_tts.core.models` configuration and modeling modules,
    loaded without its package `__init__`s (which import the whole inference
    stack and its audio dependencies)."""
    src = tmp / "src"
    with zipfile.ZipFile(_qwen_tts_wheel(tmp)) as z:
        z.extractall(src)
    root = src / "qwen_tts"
    for name, path in (
        ("qwen_tts", root),
        ("qwen_tts.core", root / "core"),
        ("qwen_tts.core.models", root / "core" / "models"),
        ("qwen_tts.inference", root / "inference"),
    ):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules[name] = mod
    # modeling_qwen3_tts imports the speech tokenizer wrapper only to load a
    # codec at inference time, which making a checkpoint never does.
    stub = types.ModuleType("qwen_tts.inference.qwen3_tts_tokenizer")
    stub.Qwen3TTSTokenizer = None
    sys.modules[stub.__name__] = stub
    import importlib

    cfg = importlib.import_module("qwen_tts.core.models.configuration_qwen3_tts")
    modeling = importlib.import_module("qwen_tts.core.models.modeling_qwen3_tts")
    if "default" not in modeling.ROPE_INIT_FUNCTIONS:
        # transformers 5 dropped the "default" entry the wheel's rotary
        # embeddings look up; its buffers are not saved, so any plain RoPE does.
        modeling.ROPE_INIT_FUNCTIONS = {**modeling.ROPE_INIT_FUNCTIONS, "default": _default_rope}
    return cfg, modeling


def _default_rope(config, device=None, *args, **kwargs):
    import torch

    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = float(getattr(config, "rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    return inv_freq, 1.0


def _save_bf16(module, path: Path, drop_prefixes: tuple[str, ...] = ()) -> int:
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for name, value in module.state_dict().items():
        if name.startswith(drop_prefixes):
            continue
        value = value.detach()
        if value.is_floating_point():
            value = value.to(torch.bfloat16)
        tensors[name] = value.contiguous().clone()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def write_talker(dst: Path, tmp: Path) -> None:
    import torch

    cfg_mod, modeling = _load_qwen_tts_models(tmp)
    config_dict = model_config()
    kwargs = json.loads(json.dumps(config_dict))
    for key in ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version"):
        del kwargs[key]
    # transformers 5 no longer gives every config a pad_token_id, which the
    # wheel's modeling code reads.
    kwargs["talker_config"]["pad_token_id"] = None
    kwargs["talker_config"]["code_predictor_config"]["pad_token_id"] = None
    config = cfg_mod.Qwen3TTSConfig(**kwargs)
    torch.manual_seed(SEED)
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval()
    _save_bf16(model, dst / "model.safetensors")
    write_json(dst / "config.json", config_dict)
    write_json(
        dst / "generation_config.json",
        {"do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
         "max_new_tokens": 64, "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50,
         "subtalker_top_p": 1.0},
    )


# ------------------------------------------------------------------- codec


def write_speech_tokenizer(dst: Path) -> None:
    import torch
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    out = dst / "speech_tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    config_dict = speech_tokenizer_config()
    config = Qwen3TTSTokenizerV2Config(
        **{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
    )
    torch.manual_seed(SEED + 1)
    model = Qwen3TTSTokenizerV2Model(config).eval()
    _make_audible(model, torch.Generator().manual_seed(SEED + 2))
    _save_bf16(model, out / "model.safetensors")
    write_json(out / "config.json", config_dict)
    write_json(out / "preprocessor_config.json", PREPROCESSOR)


def _make_audible(model, gen) -> None:
    """Random weights as initialised decode to silence: the codebooks start
    at zero and each decoder block shrinks the signal. Fill the codebooks,
    give the decoder's convolutions unit-gain weights and scale the last one
    so that random codes decode to noise of about 0.2 peak."""
    import math

    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("embedding_sum", "embed_sum")):
                param.copy_(torch.randn(param.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith(("embedding_sum", "embed_sum")):
                buf.copy_(torch.randn(buf.shape, generator=gen))
        convs = [m for m in model.decoder.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))]
        for conv in convs:
            w = conv.weight
            if isinstance(conv, torch.nn.Conv1d):
                fan_in = w.shape[1] * w.shape[2]
            else:
                fan_in = max(1, w.shape[0] * w.shape[2] // conv.stride[0])
            w.copy_(torch.randn(w.shape, generator=gen) / math.sqrt(fan_in))
        model.decoder.decoder[-1].conv.weight.mul_(1 / 300)


# --------------------------------------------------------------------- make


def is_current(dst: str | os.PathLike) -> bool:
    return _tiny_model.is_current(dst, MARKER, FORMAT_VERSION)


def make(dst: str | os.PathLike) -> Path:
    """Build the tiny model in `dst` unless it is already there; returns `dst`."""
    stamp = {"format": FORMAT_VERSION, "seed": SEED, "qwen_tts": QWEN_TTS_VERSION}
    return _tiny_model.make(dst, MARKER, stamp, _write, "tiny-tts")


def _write(build: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tiny-tts-src-"))
    saved_modules = dict(sys.modules)
    try:
        write_tokenizer(build)
        write_talker(build, tmp)
        write_speech_tokenizer(build)
    finally:
        for name in [n for n in sys.modules if n not in saved_modules and n.startswith("qwen_tts")]:
            del sys.modules[name]
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_tts.py DST")
    print(make(sys.argv[1]))
