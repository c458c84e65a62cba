"""What the tiny random checkpoints of the Qwen omni families share besides their weights: a Qwen-style
tokenizer trained offline, the chat template in the releases' form, the processor's files, the shards.

* :func:`build_tokenizer` trains a byte-level BPE (the ``tokenizers`` library) on a family's fixed corpus
  and wraps it in transformers' ``Qwen2Tokenizer`` (Qwen's pre-tokenizer and byte-level decoder) with the
  family's special tokens after it, the attributes its processor reads (``audio_token``, ...) and its chat
  template.  The role words are single tokens, as in Qwen's vocabulary (a talker finds the turns by the
  token after ``<|im_start|>``).  Same corpus, same tokenizer: training is deterministic.
* :class:`TokenizerSpec` holds what a family's tokenizer adds (its special and media tokens) and builds it,
  its processor's token attributes and its chat template from them.
* :func:`chat_template` renders messages as the releases' templates do for text, audio, image and video
  parts: ``<|im_start|>{role}\\n``, each part in order between its medium's start and end tokens,
  ``<|im_end|>\\n``, ``<|im_start|>assistant\\n`` as the generation prompt; optionally a default system
  turn when the first message is not a system message.
* :func:`processor_tokens` names the media tokens as the processor's tokenizer attributes;
  :func:`decoder_sizes` and :func:`vision_sizes` a decoder's and a vision tower's config sizes;
  :func:`seed_weights` draws a random model's matrices at a scale that keeps activations alive
  (:data:`THINKER_GAINS` the thinker's scales); :data:`THINKER_SIZES` the thinker's sizes at each size;
* :func:`write_processor_files` writes ``preprocessor_config.json`` (Whisper feature extractor and the
  Qwen2-VL image processor together) and ``chat_template.json``; :func:`save_weights` the model in at least
  two safetensors shards with their index, as released checkpoints are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

SAMPLE_RATE = 16_000
ROLES = ("system", "user", "assistant")
CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""The special tokens every Qwen tokenizer starts with: the pad, and the turns' start and end (the eos)."""


@attrs.frozen
class Media:
    """One medium's tokens in a prompt: ``start``, the placeholder ``pad``, ``end``."""

    start: str
    pad: str
    end: str

    def render(self) -> str:
        return self.start + self.pad + self.end


def processor_tokens(audio: Media, image: Media, video: Media, *, image_first: bool = False) -> dict[str, str]:
    """The token attributes a Qwen omni processor reads from its tokenizer, from the media's tokens.

    Their order fixes the tokens' ids (:func:`build_tokenizer` adds them in it): the audio and image
    placeholders (``image_first``: the image's first), the video's, then the same two media's start and end
    tokens in the same order."""
    media = [("image", "vision", image), ("audio", "audio", audio)]
    media = media if image_first else media[::-1]
    tokens = {f"{name}_token": medium.pad for name, _, medium in media} | {"video_token": video.pad}
    for _, bounds, medium in media:
        tokens |= {f"{bounds}_bos_token": medium.start, f"{bounds}_eos_token": medium.end}
    return tokens


def build_tokenizer(
    corpus: Sequence[str],
    special_tokens: Sequence[str],
    named_tokens: Mapping[str, str],
    template: str,
    vocab_size: int,
) -> Any:
    """A ``Qwen2Tokenizer`` of about ``vocab_size`` ids: a byte-level BPE trained on ``corpus``, then
    ``special_tokens``; ``named_tokens`` its attributes (``audio_token``: ``"<|AUDIO|>"``, ...) and
    ``template`` its chat template (module docstring)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer)
    state = bpe.model.__getstate__()
    model = json.loads(state) if isinstance(state, str | bytes) else state
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    options: dict[str, Any] = {"merges": merges, "unk_token": None}  # merge pairs, no unknown token
    tokenizer = Qwen2Tokenizer(
        vocab=dict(bpe.get_vocab()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=dict(named_tokens),
        **options,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    tokenizer.chat_template = template
    for role in ROLES:
        ids = tokenizer.encode(f"<|im_start|>{role}\n", add_special_tokens=False)
        if len(ids) != 3:
            raise RuntimeError(f"build_tokenizer: {role!r} after <|im_start|> is not one token ({ids})")
    return tokenizer


@attrs.frozen
class TokenizerSpec:
    """A family's tiny tokenizer: its ``special_tokens`` (added after the BPE's and :data:`CHAT_TOKENS`, in
    this order), its media's tokens (a video is framed as an image is, around ``video_pad``), and the two
    ways the families differ in rendering them (``image_first``: the id order of :func:`processor_tokens`;
    ``default_system``: :func:`chat_template`'s default system turn)."""

    special_tokens: tuple[str, ...]
    audio: Media
    image: Media
    video_pad: str
    image_first: bool = False
    default_system: str | None = None

    @property
    def video(self) -> Media:
        """The video's tokens: ``video_pad`` between the image's start and end."""
        return Media(self.image.start, self.video_pad, self.image.end)

    @property
    def named_tokens(self) -> dict[str, str]:
        """The token attributes the family's processor reads (:func:`processor_tokens`)."""
        return processor_tokens(self.audio, self.image, self.video, image_first=self.image_first)

    @property
    def chat_template(self) -> str:
        """The family's chat template (:func:`chat_template`)."""
        return chat_template(self.audio, self.image, self.video, self.default_system)

    def build(self, corpus: Sequence[str], vocab_size: int) -> Any:
        """:func:`build_tokenizer` with this family's tokens and template: same corpus, same tokenizer."""
        special = (*CHAT_TOKENS, *self.special_tokens)
        return build_tokenizer(corpus, special, self.named_tokens, self.chat_template, vocab_size)


def token_id(tokenizer: Any, token: str) -> int:
    """The id of ``token`` (a special token or a role word); a RuntimeError if it is not one token."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"{token!r} is not one token of this tokenizer ({ids})")
    return int(ids[0])


def chat_template(audio: Media, image: Media, video: Media, default_system: str | None = None) -> str:
    """The Jinja chat template (module docstring)."""
    system = (
        "{%- if loop.first and message['role'] != 'system' -%}"
        "{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' -}}"
        "{%- endif -%}"
        if default_system is not None
        else ""
    )
    return (
        "{%- for message in messages -%}" + system + "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        "{%- if message['content'] is string -%}"
        "{{- message['content'] -}}"
        "{%- else -%}"
        "{%- for part in message['content'] -%}"
        "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
        "{{- '" + audio.render() + "' -}}"
        "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
        "{{- '" + image.render() + "' -}}"
        "{%- elif part['type'] == 'video' or 'video' in part -%}"
        "{{- '" + video.render() + "' -}}"
        "{%- elif 'text' in part -%}"
        "{{- part['text'] -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{- '<|im_start|>assistant\\n' -}}"
        "{%- endif -%}"
    )


@attrs.frozen
class ImageProcessing:
    """The Qwen2-VL image processor's settings: ``patch_size``, ``max_pixels`` (images resize to at most that
    many), the normalisation; the smallest image is one merged patch (``merge_size`` patches a side)."""

    patch_size: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    merge_size: int = 2


def write_processor_files(directory: Path, processor_class: str, image: ImageProcessing, template: str) -> None:
    """``preprocessor_config.json`` (feature extractor and image processor) and ``chat_template.json``."""
    min_pixels = (image.patch_size * image.merge_size) ** 2
    preprocessor = {
        "processor_class": processor_class,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": SAMPLE_RATE,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 300,
        "n_samples": 300 * SAMPLE_RATE,
        "nb_max_frames": 30000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(image.mean),
        "image_std": list(image.std),
        "do_convert_rgb": True,
        "min_pixels": min_pixels,
        "max_pixels": image.max_pixels,
        "size": {"shortest_edge": min_pixels, "longest_edge": image.max_pixels},
        "patch_size": image.patch_size,
        "temporal_patch_size": 2,
        "merge_size": image.merge_size,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")


def save_weights(model: Any, tokenizer: Any, directory: Path) -> None:
    """``model`` (``save_pretrained``: config, generation config, three safetensors shards and their index)
    and ``tokenizer`` into ``directory``."""
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(directory, max_shard_size=total // 3 + 1)
    tokenizer.save_pretrained(directory)


def decoder_sizes(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int | None = None) -> dict[str, int]:
    """A transformers decoder config's sizes, in this order: ``hidden_size``, ``intermediate_size`` (twice
    the hidden size), ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` and, when
    given, ``head_dim`` (the order the config files list them in)."""
    sizes = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
    }
    if head_dim is not None:
        sizes["head_dim"] = head_dim
    return sizes


def vision_sizes(depth: int, hidden: int, patch_size: int, out_hidden: int) -> dict[str, int]:
    """A Qwen vision tower config's sizes, in this order: ``depth``, ``hidden_size``, ``intermediate_size``
    (twice the hidden size), ``num_heads`` 2, ``patch_size``, ``spatial_merge_size`` 2,
    ``temporal_patch_size`` 2, then ``out_hidden_size`` (the thinker's hidden size)."""
    return {
        "depth": depth,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_heads": 2,
        "patch_size": patch_size,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": out_hidden,
    }


THINKER_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1},
    "medium": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2},
}
"""Every family's thinker at each size (``tiny``, ``medium``): its hidden size, layers, attention and
key/value heads; a family's own table adds the rest."""

THINKER_GAINS: tuple[tuple[str, float], ...] = (
    ("thinker.audio_tower.", 1.5),
    ("thinker.visual.", 1.5),
    ("thinker.model.embed_tokens.", 8.0),
    ("thinker.lm_head.", 16.0),
    ("thinker.", 1.0),
)
"""The thinker's part of :func:`seed_weights`' ``gains``, the same in every family (its parameter names
are): the encoders' outputs stay well above zero, the embeddings and the head make the answer depend on
the prompt."""


def seed_weights(model: torch.nn.Module, gains: Sequence[tuple[str, float]], generator: torch.Generator) -> None:
    """Draw every matrix (ndim >= 2) of ``model`` from ``generator``'s normal with a standard deviation of
    ``gain / sqrt(fan_in)``, in the order of the parameters' names; the gain is that of the first prefix in
    ``gains`` the name starts with.  A fused MoE expert tensor (``...experts...``, ``[E, out, in]``) has the
    fan-in of one expert."""
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim < 2:
                continue
            gain = next(gain for prefix, gain in gains if name.startswith(prefix))
            fan_in = param.shape[-1] if ".experts." in name else math.prod(param.shape[1:])
            param.copy_(torch.randn(param.shape, generator=generator) * (gain / math.sqrt(fan_in)))


__all__ = [
    "CHAT_TOKENS",
    "ROLES",
    "SAMPLE_RATE",
    "THINKER_GAINS",
    "THINKER_SIZES",
    "ImageProcessing",
    "Media",
    "TokenizerSpec",
    "build_tokenizer",
    "chat_template",
    "processor_tokens",
    "save_weights",
    "seed_weights",
    "token_id",
    "write_processor_files",
]
