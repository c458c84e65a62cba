"""Qwen3-Omni's processor without video: what ``Qwen3OmniMoeProcessor`` produces for text, audio and images.

``Qwen3OmniMoeProcessor`` cannot be built with the pinned CPU torch (its constructor insists on the
torchvision video processor), so :class:`OmniProcessor` assembles the checkpoint's own parts: the tokenizer,
``WhisperFeatureExtractor``, the Qwen2-VL image processor (the PIL one: no torchvision) and the chat template,
and expands the placeholders as that processor does:

* each ``<|audio_pad|>`` (in order) becomes ``L`` copies, ``L`` = the audio encoder's output length of the
  clip's mel frames (:func:`audio_token_count`);
* each ``<|image_pad|>`` becomes ``t * h * w / merge_size**2`` copies for the image's ``image_grid_thw``.

All clips of one prompt go through the feature extractor in one call, padded to the longest, as the
processor does (a clip's last frames depend on that padding).  A prompt with video is a ``ValueError``.
Instances are read-only after construction; calls from several threads are safe as far as the
tokenizer's are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from schedulers.qwen3_omni.checkpoint import CheckpointError

SAMPLE_RATE = 16_000


def audio_token_count(mel_frames: int) -> int:
    """Audio tokens for ``mel_frames`` frames: the tower's conv output per 100-frame chunk (13) plus the rest."""
    rest = mel_frames % 100
    conv = (rest - 1) // 2 + 1
    return ((conv - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // 100) * 13


class OmniProcessor:
    """Chat template + tokenizer + feature extractor + image processor of one checkpoint (module docstring)."""

    def __init__(
        self, tokenizer: Any, feature_extractor: Any, image_processor: Any, chat_template: str, device: str = "cpu"
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device  # where the feature extractor computes the log-mel spectrogram
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.audio_token = tokenizer.audio_token
        self.image_token = tokenizer.image_token
        self.video_token = tokenizer.video_token
        if feature_extractor.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"feature extractor: sampling_rate {feature_extractor.sampling_rate}, expected 16000")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str = "cpu") -> OmniProcessor:
        """Read the parts from a checkpoint directory; a missing or unreadable part is a CheckpointError.
        ``device``: where the audio features are computed (they come back on the CPU, float32)."""
        # The classes themselves, not transformers' Auto* machinery: a stage imports what it runs.
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
        for name in ("audio_token", "image_token", "video_token"):
            if not isinstance(getattr(tokenizer, name, None), str):
                raise CheckpointError(f"{directory}: the tokenizer has no {name} (Qwen3-Omni's special tokens)")
        return cls(tokenizer, feature_extractor, image_processor, _chat_template(directory, tokenizer), device)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt text of chat ``messages`` (transformers' chat format), generation prompt appended."""
        text = self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def __call__(
        self, text: str, audio: Sequence[np.ndarray] = (), images: Sequence[Any] = ()
    ) -> dict[str, torch.Tensor]:
        """Tensors for one prompt, as ``Qwen3OmniMoeProcessor(text, audio, images, return_tensors="pt")``.

        ``input_ids`` / ``attention_mask`` ``[1, P]``; with audio ``input_features`` ``[n_clips, 128, T]``
        and ``feature_attention_mask`` ``[n_clips, T]``; with images ``pixel_values`` and ``image_grid_thw``
        ``[n_images, 3]``.  ``audio`` is float32 mono at 16 kHz; the placeholders in ``text`` must match the
        media in number and order, else ``ValueError``.
        """
        if self.video_token in text:
            raise ValueError("video input is not supported by this server (audio and images are)")
        out: dict[str, torch.Tensor] = {}
        counts: dict[str, list[int]] = {self.audio_token: [], self.image_token: []}
        if audio:
            features = self.feature_extractor(
                [np.asarray(clip, dtype=np.float32) for clip in audio],
                sampling_rate=SAMPLE_RATE,
                padding=True,
                truncation=False,
                return_attention_mask=True,
                return_tensors="pt",
                device=self.device,
            )
            out["input_features"] = features["input_features"]
            out["feature_attention_mask"] = features["attention_mask"]
            counts[self.audio_token] = [audio_token_count(int(n)) for n in features["attention_mask"].sum(-1)]
        if images:
            pixels = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = pixels["pixel_values"]
            out["image_grid_thw"] = pixels["image_grid_thw"]
            merge = self.image_processor.merge_size**2
            counts[self.image_token] = [int(grid.prod()) // merge for grid in pixels["image_grid_thw"]]
        expanded = _expand(text, counts)
        tokens = self.tokenizer(expanded, return_tensors="pt")
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"], **out}


def _expand(text: str, counts: dict[str, list[int]]) -> str:
    """Replace each placeholder token in ``text`` by its count of copies, in order (counts must match)."""
    pieces: list[str] = []
    rest = text
    used = dict.fromkeys(counts, 0)
    while True:
        found = [(rest.find(token), token) for token in counts if token in rest]
        if not found:
            break
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


def _chat_template(directory: Path, tokenizer: Any) -> str:
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
