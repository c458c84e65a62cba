"""Random Qwen2.5-Omni checkpoints in the release's layout, for tests and benchmarks.

:func:`write_checkpoint` writes into a directory what ``Qwen/Qwen2.5-Omni-7B`` ships: ``config.json``
(``model_type`` ``qwen2_5_omni``) and ``generation_config.json``, the weights as at least two
``model-0000X-of-0000N.safetensors`` shards with ``model.safetensors.index.json``, the tokenizer
(:mod:`.tiny_tokenizer`), one ``preprocessor_config.json`` (Whisper feature extractor and Qwen2-VL image
processor, ``processor_class`` ``Qwen2_5OmniProcessor``), ``chat_template.json`` and ``spk_dict.pt`` with the
speakers ``Chelsie`` and ``Ethan``.  ``Qwen2_5OmniForConditionalGeneration.from_pretrained`` and
``Qwen2_5OmniProcessor.from_pretrained`` load it offline.  The same ``size`` and ``seed`` write the same
bytes of weights.

What makes a random checkpoint answer like a model (each is checked by the tests):

* every matrix is drawn from a seeded normal with a standard deviation ``gain / sqrt(fan_in)``, the gain
  per part in :data:`_GAINS`, so activations keep their scale and the answer depends on the prompt, the
  audio's content and the image (the library's own initialisation makes the audio tower's output vanish);
* the talker's codec ids are the release's (pad 8292, bos 8293, end 8294, mask 8296 in a vocabulary of
  8448), so ``generate``'s default ``talker_eos_token_id`` ``[8292, 8294]`` ends it; the codec head's rows
  past the DiT's code vocabulary are zero (never the greedy choice), except the end row;
* the talker says "end" when it is fed ``<tts_pad>`` (after the answer's last token), as the released
  model does: the pad row of the thinker's embedding points along a direction only the talker's first
  hidden dimension reads, that dimension sits below zero otherwise, and only the end row of the codec
  head reads it.  So an answer of N thinker tokens makes N codes;
* the speakers differ in their ``bos_token`` row (the talker's codes), ``cond`` and ``ref_mel`` (the
  DiT's conditioning); the DiT's initial noise is drawn from the seed, so the seed changes the audio.

Sizes: ``tiny`` (under 1 M parameters, half of them the talker's codec vocabulary; ``generate`` with
audio in a second or two on one core) and ``medium`` (a few M parameters per part: compute dominates the
per-call overhead on CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from schedulers import tiny_omni
from schedulers.qwen2_5_omni.tiny_tokenizer import CHAT_TEMPLATE, ReservedIds, build_tokenizer, reserved_ids, token_id
from schedulers.tiny_omni import ImageProcessing, save_weights, seed_weights, write_processor_files

Size = Literal["tiny", "medium"]
SPEAKERS = ("Chelsie", "Ethan")
IMAGE_MAX_PIXELS = 56 * 56  # images resize to at most 4x4 patches of 14 pixels: 4 image tokens
PROCESSOR_CLASS = "Qwen2_5OmniProcessor"
IMAGE_PROCESSING = ImageProcessing(
    patch_size=14,
    max_pixels=IMAGE_MAX_PIXELS,
    mean=(0.48145466, 0.4578275, 0.40821073),
    std=(0.26862954, 0.26130258, 0.27577711),
)

# The release's codec ids (Qwen2_5OmniTalkerConfig's defaults and generate's talker_eos_token_id).
CODEC_VOCAB = 8448
CODEC = {"pad": 8292, "bos": 8293, "end": 8294, "mask": 8296}
CODE_VOCAB = 8193  # the DiT's code embeddings (num_embeds): codes 0..8192
_MEL_OFFSET = -5.0  # the DiT's velocity bias: its mel centres near -5
_PAD_DIM = 0  # the thinker's residual dimension that only <tts_pad> writes

# (parameter-name prefix, gain): the first prefix a name starts with gives the gain of its matrices.
_GAINS: tuple[tuple[str, float], ...] = (
    *tiny_omni.THINKER_GAINS,
    ("talker.model.embed_tokens.", 8.0),
    ("talker.thinker_to_talker_proj.", 2.0),
    ("talker.codec_head.", 16.0),
    ("talker.", 1.0),
    ("token2wav.code2wav_dit_model.text_embed.", 4.0),
    ("token2wav.code2wav_dit_model.", 1.0),
    ("token2wav.code2wav_bigvgan_model.conv_post.", 0.03),
    ("token2wav.code2wav_bigvgan_model.", 1.0),
)

_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        **tiny_omni.THINKER_SIZES["tiny"],
        "mrope": [2, 3, 3],
        "audio_layers": 1,
        "audio_ffn": 64,
        "vision_hidden": 32,
        "vision_depth": 1,
        "talker_hidden": 16,
        "talker_layers": 1,
        "talker_mrope": [1, 1, 2],
        "dit_hidden": 32,
        "dit_layers": 4,
        "dit_heads": 2,
        "emb_dim": 8,
        "enc": 32,
        "mel_dim": 32,
        "ref_frames": 40,
        # four upsampling stages of one residual block (the release: six of three): BigVGAN stays cheap
        # beside the DiT, as in the release
        "bigvgan": {
            "upsample_initial_channel": 32,
            "upsample_rates": [8, 5, 3, 2],
            "upsample_kernel_sizes": [16, 11, 7, 4],
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
        },
    },
    "medium": {
        **tiny_omni.THINKER_SIZES["medium"],
        "mrope": [8, 12, 12],
        "audio_layers": 2,
        "audio_ffn": 512,
        "vision_hidden": 128,
        "vision_depth": 2,
        "talker_hidden": 256,
        "talker_layers": 2,
        "talker_mrope": [8, 12, 12],
        "dit_hidden": 256,
        "dit_layers": 6,
        "dit_heads": 4,
        "emb_dim": 64,
        "enc": 96,
        "mel_dim": 80,
        "ref_frames": 120,
        "bigvgan": {"upsample_initial_channel": 128},
    },
}


def build_config(size: Size, tokenizer: Any, reserved: ReservedIds) -> Any:
    """The ``Qwen2_5OmniConfig`` of a ``size`` checkpoint whose token ids are ``tokenizer``'s."""
    from transformers import Qwen2_5OmniConfig

    s = _SIZES[size]
    ids = {name: token_id(tokenizer, token) for name, token in _TOKENS.items()}
    hidden, heads = s["hidden"], s["heads"]
    if sum(s["mrope"]) * 2 != hidden // heads:
        raise ValueError(f"mrope sections {s['mrope']} must sum to head_dim/2 = {hidden // heads // 2}")
    media = {
        "audio_token_index": ids["audio"],
        "image_token_index": ids["image"],
        "video_token_index": ids["video"],
        "audio_start_token_id": ids["audio_bos"],
        "audio_end_token_id": ids["audio_eos"],
        "vision_start_token_id": ids["vision_bos"],
        "vision_end_token_id": ids["vision_eos"],
    }
    thinker = {
        "text_config": {
            "vocab_size": reserved.vocab_size,
            **tiny_omni.decoder_sizes(hidden, s["layers"], heads, s["kv_heads"]),
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": s["mrope"]},
            "tie_word_embeddings": False,
            "eos_token_id": ids["im_end"],
            "pad_token_id": ids["endoftext"],
        },
        "audio_config": {
            "num_mel_bins": 128,
            "d_model": hidden,
            "encoder_layers": s["audio_layers"],
            "encoder_attention_heads": heads,
            "encoder_ffn_dim": s["audio_ffn"],
            "output_dim": hidden,
            "max_source_positions": 1500,
            "n_window": 100,
        },
        "vision_config": {
            **tiny_omni.vision_sizes(s["vision_depth"], s["vision_hidden"], 14, hidden),
            "window_size": 112,
            "fullatt_block_indexes": [s["vision_depth"] - 1],
        },
        "user_token_id": ids["user"],
        "bos_token_id": ids["im_start"],
        "eos_token_id": ids["im_end"],
        "pad_token_id": ids["endoftext"],
        **media,
    }
    t_hidden = s["talker_hidden"]
    talker = {
        "vocab_size": CODEC_VOCAB,
        "embedding_size": hidden,
        **tiny_omni.decoder_sizes(t_hidden, s["talker_layers"], heads, s["kv_heads"], t_hidden // heads),
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": s["talker_mrope"]},
        "tts_text_start_token_id": reserved.tts_text_bos,
        "tts_text_end_token_id": reserved.tts_text_eod,
        "tts_text_pad_token_id": reserved.tts_text_pad,
        "tts_codec_start_token_id": CODEC["bos"],
        "tts_codec_end_token_id": CODEC["end"],
        "tts_codec_pad_token_id": CODEC["pad"],
        "tts_codec_mask_token_id": CODEC["mask"],
        "spatial_merge_size": 2,
        **media,
    }
    enc = s["enc"]
    dit = {
        "hidden_size": s["dit_hidden"],
        "num_hidden_layers": s["dit_layers"],
        "num_attention_heads": s["dit_heads"],
        "head_dim": s["dit_hidden"] // s["dit_heads"],
        "ff_mult": 2,
        "emb_dim": s["emb_dim"],
        "max_position_embeddings": 32768,
        "block_size": 24,
        "look_ahead_layers": [s["dit_layers"] // 2],
        "look_backward_layers": [0, s["dit_layers"] - 1],
        "repeats": 2,
        "num_embeds": CODE_VOCAB,
        "mel_dim": s["mel_dim"],
        "enc_emb_dim": enc,
        "enc_dim": enc,
        "enc_channels": [enc, enc, enc, enc, 3 * enc],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": enc // 2,
        "enc_res2net_scale": 2,
        "enc_se_channels": enc // 2,
    }
    bigvgan = {"mel_dim": s["mel_dim"], **s["bigvgan"]}
    return Qwen2_5OmniConfig(
        thinker_config=thinker,
        talker_config=talker,
        token2wav_config={"dit_config": dit, "bigvgan_config": bigvgan},
    )


_TOKENS = {
    "audio": "<|AUDIO|>",
    "image": "<|IMAGE|>",
    "video": "<|VIDEO|>",
    "audio_bos": "<|audio_bos|>",
    "audio_eos": "<|audio_eos|>",
    "vision_bos": "<|vision_bos|>",
    "vision_eos": "<|vision_eos|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "endoftext": "<|endoftext|>",
    "user": "user",
}


def _voice_the_end(model: Any) -> None:
    """The talker says "end" on ``<tts_pad>`` and never picks an id past the DiT's codes (module docstring).

    One dimension of the thinker's residual stream (:data:`_PAD_DIM`) is zero everywhere: no embedding
    row, encoder output or layer writes it, except the ``<tts_pad>`` row.  The talker's first hidden
    dimension reads only that one (minus a bias), no talker layer writes it, and only the end row of the
    codec head reads it: below zero on every other input, far above on ``<tts_pad>``.
    """
    thinker, talker = model.thinker, model.talker
    pad_id, end_id = talker.config.tts_text_pad_token_id, talker.config.tts_codec_end_token_id
    text = thinker.model.language_model
    writers = [thinker.model.audio_tower.proj, thinker.model.visual.merger.mlp[2]]
    writers += [module for layer in text.layers for module in (layer.self_attn.o_proj, layer.mlp.down_proj)]
    with torch.no_grad():
        embed = thinker.get_input_embeddings().weight
        scale = float(embed.norm(dim=1).mean())
        embed[:, _PAD_DIM] = 0
        embed[pad_id, _PAD_DIM] = 16 * scale
        for module in writers:
            module.weight[_PAD_DIM] = 0
            if module.bias is not None:
                module.bias[_PAD_DIM] = 0
        talker.get_input_embeddings().weight[:, _PAD_DIM] = 0
        proj = talker.thinker_to_talker_proj
        proj.weight[:, _PAD_DIM] = 0
        proj.weight[0] = 0
        proj.weight[0, _PAD_DIM] = 8 / scale
        proj.bias[0] = -2.0
        for layer in talker.model.layers:
            layer.self_attn.o_proj.weight[0] = 0
            layer.mlp.down_proj.weight[0] = 0
        head = talker.codec_head.weight
        head[:, 0] = 0
        head[CODE_VOCAB:] = 0
        head[end_id, 0] = 8.0


def _place_the_mel(model: Any) -> None:
    """The DiT's mel in the range of log-mel spectra (BigVGAN clips above about +2.3)."""
    with torch.no_grad():
        model.token2wav.code2wav_dit_model.proj_out.bias.fill_(_MEL_OFFSET)


def _speaker_rows(model: Any, reserved: ReservedIds, generator: torch.Generator, ref_frames: int) -> dict[str, Any]:
    """``spk_dict.pt``'s content: per speaker its ``bos_token`` row, ``cond`` and reference mel."""
    dit = model.config.token2wav_config.dit_config
    speakers: dict[str, Any] = {}
    for index, name in enumerate(SPEAKERS):
        frames = ref_frames + 8 * index
        speakers[name] = {
            "bos_token": reserved.speaker_bos[index],
            "cond": torch.randn(1, dit.enc_emb_dim, generator=generator),
            "ref_mel": torch.randn(1, frames, dit.mel_dim, generator=generator) * 2.0 - 4.0,
        }
    return speakers


def build_model(size: Size = "tiny", seed: int = 0, tokenizer: Any = None) -> tuple[Any, dict[str, Any]]:
    """A seeded ``Qwen2_5OmniForConditionalGeneration`` of ``size`` (float32, eval) and its speakers."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    reserved = reserved_ids(tokenizer, len(SPEAKERS))
    config = build_config(size, tokenizer, reserved)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5OmniForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    seed_weights(model, _GAINS, generator)
    _voice_the_end(model)
    _place_the_mel(model)
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise RuntimeError(f"parameter {name} is not initialised")
    speakers = _speaker_rows(model, reserved, generator, _SIZES[size]["ref_frames"])
    model.speaker_map = dict(speakers)
    return model.eval(), speakers


def write_checkpoint(directory: Path, *, size: Size = "tiny", seed: int = 0) -> Path:
    """Write a random checkpoint of ``size`` into ``directory`` (created) and return it (module docstring)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model, speakers = build_model(size, seed, tokenizer)
    save_weights(model, tokenizer, directory)
    torch.save(speakers, directory / "spk_dict.pt")
    write_processor_files(directory, PROCESSOR_CLASS, IMAGE_PROCESSING, CHAT_TEMPLATE)
    return directory
