"""Random Qwen3-Omni checkpoints laid out as the released one is: the server tried without weights, tests, benchmarks.

:func:`write_checkpoint` writes, into a directory: ``config.json`` and ``generation_config.json``
(``Qwen3OmniMoeForConditionalGeneration.save_pretrained``), the weights as at least two
``model-0000X-of-0000N.safetensors`` shards with ``model.safetensors.index.json``, the tokenizer
(:mod:`.tiny_tokenizer`), the feature extractor and image processor configuration
(``preprocessor_config.json``) and the chat template (``chat_template.json``).  Two calls with the same
``size`` and ``seed`` write identical weights.

The weights are random but scaled so the model's answer depends on what it is given (the library's
default initialisation shrinks the audio tower's output to ~1e-7, lets the speaker row vanish in the
talker, and makes code2wav silent): every matrix is drawn from a seeded normal with a standard deviation
of ``gain / sqrt(fan_in)``, the gain per part in :data:`_GAINS`, so activations keep their scale.  The
talker's MoE experts and router, which the library leaves uninitialised, are drawn the same way.

Sizes: ``tiny`` (~0.3 M parameters: thinker hidden 32, 4 code groups, codebook 32; ``generate`` with
audio in well under a second on one core) and ``medium`` (thinker hidden 256, 8 code groups, codebook
256, a few M parameters per part: compute dominates over per-call overhead on CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from schedulers import tiny_omni
from schedulers.qwen3_omni.tiny_tokenizer import CHAT_TEMPLATE, build_tokenizer, token_id
from schedulers.tiny_omni import ImageProcessing, save_weights, seed_weights, write_processor_files

Size = Literal["tiny", "medium"]
SPEAKERS = ("chelsie", "ethan", "aiden")
DEFAULT_SPEAKER = "ethan"  # generate's own default ("Ethan")
IMAGE_PIXELS = 32 * 32 * 4  # the image processor's max_pixels: images resize to at most 64x64
PROCESSOR_CLASS = "Qwen3OmniMoeProcessor"
IMAGE_PROCESSING = ImageProcessing(patch_size=16, max_pixels=IMAGE_PIXELS, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

# (parameter-name prefix, gain): the first prefix a name starts with gives the gain of its matrices.
_GAINS: tuple[tuple[str, float], ...] = (
    *tiny_omni.THINKER_GAINS,
    ("talker.model.codec_embedding.", 8.0),
    ("talker.text_projection.", 2.0),
    ("talker.hidden_projection.", 2.0),
    ("talker.codec_head.", 16.0),
    ("talker.code_predictor.model.codec_embedding.", 8.0),
    ("talker.code_predictor.lm_head.", 16.0),
    ("talker.", 1.0),
    ("code2wav.", 0.75),
)

_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        **tiny_omni.THINKER_SIZES["tiny"],
        "experts": 4,
        "moe_intermediate": 32,
        "mrope": [4, 2, 2],
        "audio_layers": 1,
        "audio_ffn": 64,
        "audio_down": 8,
        "vision_hidden": 32,
        "vision_depth": 1,
        "talker_hidden": 32,
        "talker_layers": 1,
        "talker_experts": 2,
        "predictor_layers": 1,
        "code_groups": 4,
        "codebook": 32,
        "c2w_hidden": 32,
        "c2w_layers": 1,
        "c2w_decoder": 32,
    },
    "medium": {
        **tiny_omni.THINKER_SIZES["medium"],
        "experts": 8,
        "moe_intermediate": 256,
        "mrope": [12, 10, 10],
        "audio_layers": 2,
        "audio_ffn": 512,
        "audio_down": 32,
        "vision_hidden": 128,
        "vision_depth": 2,
        "talker_hidden": 256,
        "talker_layers": 2,
        "talker_experts": 4,
        "predictor_layers": 2,
        "code_groups": 8,
        "codebook": 256,
        "c2w_hidden": 128,
        "c2w_layers": 2,
        "c2w_decoder": 256,
    },
}


def build_config(size: Size, tokenizer: Any) -> Any:
    """The ``Qwen3OmniMoeConfig`` of a ``size`` checkpoint whose token ids are ``tokenizer``'s."""
    from transformers import Qwen3OmniMoeConfig

    s = _SIZES[size]
    ids = {name: token_id(tokenizer, tok) for name, tok in _TOKEN_IDS.items()}
    vocab = 64 * math.ceil(len(tokenizer) / 64)
    hidden, head_dim = s["hidden"], s["hidden"] // s["heads"]
    if sum(s["mrope"]) * 2 != head_dim:
        raise ValueError(f"mrope sections {s['mrope']} must sum to head_dim/2 = {head_dim // 2}")
    cb = s["codebook"]
    codec = {"pad": cb, "bos": cb + 1, "eos": cb + 2, "nothink": cb + 3, "think_bos": cb + 4, "think_eos": cb + 5}
    text = {
        "vocab_size": vocab,
        **tiny_omni.decoder_sizes(hidden, s["layers"], s["heads"], s["kv_heads"], head_dim),
        "moe_intermediate_size": s["moe_intermediate"],
        "num_experts": s["experts"],
        "num_experts_per_tok": 2,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": s["mrope"],
            "interleaved": True,
        },
    }
    thinker = {
        "text_config": text,
        "audio_config": {
            "num_mel_bins": 128,
            "d_model": hidden,
            "encoder_layers": s["audio_layers"],
            "encoder_attention_heads": s["heads"],
            "encoder_ffn_dim": s["audio_ffn"],
            "output_dim": hidden,
            "downsample_hidden_size": s["audio_down"],
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 400,
        },
        "vision_config": {
            **tiny_omni.vision_sizes(s["vision_depth"], s["vision_hidden"], 16, hidden),
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": list(range(s["vision_depth"])),
        },
        **_token_ids(ids, "audio", "image", "video", "audio_start", "vision_start", "user"),
    }
    t_hidden = s["talker_hidden"]
    talker = {
        "text_config": {
            "vocab_size": cb + 1024,
            **tiny_omni.decoder_sizes(t_hidden, s["talker_layers"], s["heads"], s["kv_heads"], t_hidden // s["heads"]),
            "moe_intermediate_size": t_hidden,
            "shared_expert_intermediate_size": t_hidden,
            "num_experts": s["talker_experts"],
            "num_experts_per_tok": 1,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [x * t_hidden // hidden for x in s["mrope"]],
                "interleaved": True,
            },
        },
        "code_predictor_config": {
            "vocab_size": cb,
            **tiny_omni.decoder_sizes(
                t_hidden, s["predictor_layers"], s["heads"], s["kv_heads"], t_hidden // s["heads"]
            ),
            "num_code_groups": s["code_groups"],
        },
        "num_code_groups": s["code_groups"],
        "thinker_hidden_size": hidden,
        "accept_hidden_layer": s["layers"],
        "codec_eos_token_id": codec["eos"],
        "codec_pad_id": codec["pad"],
        "codec_bos_id": codec["bos"],
        "codec_nothink_id": codec["nothink"],
        "codec_think_bos_id": codec["think_bos"],
        "codec_think_eos_id": codec["think_eos"],
        "speaker_id": {name: cb + 10 + i for i, name in enumerate(SPEAKERS)},
        **_token_ids(ids, "audio", "image", "video", "vision_start", "audio_start"),
        "spatial_merge_size": 2,
    }
    code2wav = {
        "codebook_size": cb,
        **tiny_omni.decoder_sizes(s["c2w_hidden"], s["c2w_layers"], 2, 2),
        "num_quantizers": s["code_groups"],
        "decoder_dim": s["c2w_decoder"],
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        **_token_ids(ids, "im_start", "im_end", "tts_pad", "tts_bos", "tts_eos", "system", "user", "assistant"),
    )


def _token_ids(ids: Mapping[str, int], *names: str) -> dict[str, Any]:
    """The config fields ``{name}_token_id`` of the tokens :data:`_TOKEN_IDS` calls ``names``."""
    return {f"{name}_token_id": ids[name] for name in names}


_TOKEN_IDS = {
    "audio": "<|audio_pad|>",
    "image": "<|image_pad|>",
    "video": "<|video_pad|>",
    "audio_start": "<|audio_start|>",
    "vision_start": "<|vision_start|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "tts_pad": "<tts_pad>",
    "tts_bos": "<tts_text_bos>",
    "tts_eos": "<tts_text_eod>",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}


def build_model(size: Size = "tiny", seed: int = 0, tokenizer: Any = None) -> Any:
    """A seeded ``Qwen3OmniMoeForConditionalGeneration`` of ``size``, in memory (float32, eval mode)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    config = build_config(size, tokenizer if tokenizer is not None else build_tokenizer())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config)
    seed_weights(model, _GAINS, torch.Generator().manual_seed(seed))
    _check_deterministic(model)
    patch_loaded_model(model)
    return model.eval()


def _check_deterministic(model: torch.nn.Module) -> None:
    """Vectors the library leaves uninitialised would differ run to run: refuse any that hold NaN/inf."""
    for name, param in model.named_parameters():
        if param.ndim < 2 and not torch.isfinite(param).all():
            raise RuntimeError(f"parameter {name} is not initialised")


def patch_loaded_model(model: Any) -> None:
    """transformers 5.23: the talker reads ``config.audio_config`` on prompts with audio and an image."""
    model.talker.config.audio_config = model.thinker.config.audio_config


def write_checkpoint(directory: str | Path, *, size: Size = "tiny", seed: int = 0) -> Path:
    """Write a random checkpoint of ``size`` into ``directory`` (created) and return it (module docstring)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(size, seed, tokenizer)
    save_weights(model, tokenizer, directory)
    write_processor_files(directory, PROCESSOR_CLASS, IMAGE_PROCESSING, CHAT_TEMPLATE)
    return directory
