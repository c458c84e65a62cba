"""Qwen3-Omni's processor without video: what ``Qwen3OmniMoeProcessor`` produces for text, audio and images.

The checkpoint's own parts assembled (:class:`schedulers.front.processor.ChatProcessor`), with Qwen3-Omni's
audio rules:

* each ``<|audio_pad|>`` (in order) becomes ``L`` copies, ``L`` = the audio encoder's output length of the
  clip's mel frames (:func:`audio_token_count`);
* each ``<|image_pad|>`` becomes ``t * h * w / merge_size**2`` copies for the image's ``image_grid_thw``.

All clips of one prompt go through the feature extractor in one call, padded to the longest, as the
processor does (a clip's last frames depend on that padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from schedulers.front.processor import SAMPLE_RATE, ChatProcessor


def audio_token_count(mel_frames: int) -> int:
    """Audio tokens for ``mel_frames`` frames: the tower's conv output per 100-frame chunk (13) plus the rest."""
    rest = mel_frames % 100
    conv = (rest - 1) // 2 + 1
    return ((conv - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // 100) * 13


class OmniProcessor(ChatProcessor):
    """Chat template + tokenizer + feature extractor + image processor of one checkpoint (module docstring)."""

    family = "Qwen3-Omni"

    def audio_features(self, audio: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_features [n, 128, T], feature_attention_mask [n, T])``: the clips padded to the longest."""
        features = self.feature_extractor(
            [np.asarray(clip, dtype=np.float32) for clip in audio],
            sampling_rate=SAMPLE_RATE,
            padding=True,
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
            device=self.device,
        )
        return features["input_features"], features["attention_mask"]

    def audio_token_count(self, mel_frames: int) -> int:
        return audio_token_count(mel_frames)
