"""Qwen2.5-Omni's processor without video: what ``Qwen2_5OmniProcessor`` gives for text, audio and images.

``Qwen2_5OmniProcessor``'s constructor insists on a torchvision video processor, which does not import with
the CPU torch pin, so :class:`OmniProcessor` assembles the checkpoint's own parts: its tokenizer,
``WhisperFeatureExtractor``, the Qwen2-VL image processor (the PIL one) and its chat template, and expands
the placeholders as that processor does:

* each ``<|AUDIO|>`` (in order) becomes ``((n - 1) // 2 + 1 - 2) // 2 + 1`` copies for a clip of ``n`` mel
  frames (:func:`audio_token_count`);
* each ``<|IMAGE|>`` becomes ``t * h * w / merge_size**2`` copies for the image's ``image_grid_thw``.

Audio: the processor pads every clip to the feature extractor's ``n_samples`` (five minutes) and returns
all those frames.  Here each clip is padded with zeros only as far as its mel frames need (at least
``n_fft`` samples past the longest clip, as far as ``n_samples``), and the frames are cut after the longest
clip's last: ``input_features[:, :, :T]`` and ``feature_attention_mask[:, :T]`` equal the processor's, ``T``
the longest clip's frame count, and the frames past ``T`` (padding the model never reads) are not sent.  A
clip longer than ``n_samples`` is cut there, as the processor cuts it.

A prompt with video is a ``ValueError``.  Instances are read-only after construction; calls from several
threads are safe as far as the tokenizer's are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from schedulers.checkpoints import CheckpointError

SAMPLE_RATE = 16_000
_TOKENS = ("audio_token", "image_token", "video_token")


def audio_token_count(mel_frames: int) -> int:
    """Audio tokens for ``mel_frames`` frames: the audio tower's two stride-2 reductions."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


class OmniProcessor:
    """Chat template + tokenizer + feature extractor + image processor of one checkpoint (module docstring)."""

    def __init__(self, tokenizer: Any, feature_extractor: Any, image_processor: Any, chat_template: str) -> None:
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.audio_token, self.image_token, self.video_token = (getattr(tokenizer, name) for name in _TOKENS)
        if feature_extractor.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"feature extractor: sampling_rate {feature_extractor.sampling_rate}, expected 16000")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> OmniProcessor:
        """Read the parts from a checkpoint directory; a missing or unreadable part is a CheckpointError."""
        from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        from transformers.models.whisper.feature_extraction_whisper import WhisperFeatureExtractor

        directory = Path(model_dir)
        try:
            tokenizer = Qwen2Tokenizer.from_pretrained(directory)
            feature_extractor = WhisperFeatureExtractor.from_pretrained(directory)
            image_processor = Qwen2VLImageProcessorPil.from_pretrained(directory)
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{directory}: cannot load the processor ({exc})") from None
        for name in _TOKENS:
            if not isinstance(getattr(tokenizer, name, None), str):
                raise CheckpointError(f"{directory}: the tokenizer has no {name} (Qwen2.5-Omni's special tokens)")
        return cls(tokenizer, feature_extractor, image_processor, chat_template(directory, tokenizer))

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt text of chat ``messages`` (transformers' chat format), generation prompt appended."""
        text = self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def __call__(
        self, text: str, audio: Sequence[np.ndarray] = (), images: Sequence[Any] = ()
    ) -> dict[str, torch.Tensor]:
        """Tensors for one prompt, as ``Qwen2_5OmniProcessor(text, audio, images, return_tensors="pt")``.

        ``input_ids`` / ``attention_mask`` ``[1, P]``; with audio ``input_features`` ``[n_clips, 128, T]``
        and ``feature_attention_mask`` ``[n_clips, T]`` (int32; ``T`` as in the module docstring); with
        images ``pixel_values`` and ``image_grid_thw`` ``[n_images, 3]``.  ``audio`` is float32 mono at
        16 kHz; the placeholders in ``text`` must match the media in number and order, else ``ValueError``.
        """
        if self.video_token in text:
            raise ValueError("video input is not supported by this server (audio and images are)")
        out: dict[str, torch.Tensor] = {}
        counts: dict[str, list[int]] = {self.audio_token: [], self.image_token: []}
        if audio:
            features, mask = self.audio_features(audio)
            out["input_features"], out["feature_attention_mask"] = features, mask
            counts[self.audio_token] = [audio_token_count(int(n)) for n in mask.sum(-1)]
        if images:
            pixels = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = pixels["pixel_values"]
            out["image_grid_thw"] = pixels["image_grid_thw"]
            merge = self.image_processor.merge_size**2
            counts[self.image_token] = [int(grid.prod()) // merge for grid in pixels["image_grid_thw"]]
        tokens = self.tokenizer(expand_placeholders(text, counts), return_tensors="pt")
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"], **out}

    def audio_features(self, audio: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_features [n, 128, T], feature_attention_mask [n, T])`` of the clips (module docstring)."""
        extractor = self.feature_extractor
        clips = [np.asarray(clip, dtype=np.float32).reshape(-1) for clip in audio]
        if any(clip.size == 0 for clip in clips):
            raise ValueError("input_audio: a clip holds no samples")
        hop, limit = int(extractor.hop_length), int(extractor.n_samples)
        # Zeros past every clip's end reach each of its frames' windows as the processor's padding does.
        length = min(math.ceil((max(clip.size for clip in clips) + extractor.n_fft) / hop) * hop, limit)
        features = extractor(
            clips,
            sampling_rate=SAMPLE_RATE,
            padding="max_length",
            max_length=length,
            truncation=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = features["attention_mask"]
        frames = int(mask.sum(-1).max())
        return features["input_features"][:, :, :frames], mask[:, :frames].to(torch.int32)


def expand_placeholders(text: str, counts: dict[str, list[int]]) -> str:
    """Replace each placeholder token in ``text`` by its count of copies, in order (counts must match)."""
    pieces: list[str] = []
    rest = text
    used = dict.fromkeys(counts, 0)
    while found := [(rest.find(token), token) for token in counts if token in rest]:
        at, token = min(found)
        if used[token] >= len(counts[token]):
            raise ValueError(f"the prompt has more {token} placeholders than the {len(counts[token])} inputs given")
        pieces.append(rest[:at] + token * counts[token][used[token]])
        used[token] += 1
        rest = rest[at + len(token) :]
    for token, n in used.items():
        if n != len(counts[token]):
            raise ValueError(f"the prompt has {n} {token} placeholders for {len(counts[token])} inputs")
    return "".join([*pieces, rest])


def chat_template(directory: Path, tokenizer: Any) -> str:
    """The checkpoint's chat template: ``chat_template.json``, else ``chat_template.jinja``, else the
    tokenizer's; none of them is a CheckpointError."""
    path = directory / "chat_template.json"
    if path.is_file():
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
        if isinstance(template, str):
            return template
        raise CheckpointError(f"{path}: no 'chat_template' string")
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        return str(tokenizer.chat_template)
    raise CheckpointError(f"{directory}: no chat template (chat_template.json, chat_template.jinja or the tokenizer's)")
