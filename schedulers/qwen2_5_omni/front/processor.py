"""Qwen2.5-Omni's processor without video: what ``Qwen2_5OmniProcessor`` gives for text, audio and images.

The checkpoint's own parts assembled (:class:`schedulers.front.processor.ChatProcessor`), with
Qwen2.5-Omni's audio rules:

* each ``<|AUDIO|>`` (in order) becomes ``((n - 1) // 2 + 1 - 2) // 2 + 1`` copies for a clip of ``n`` mel
  frames (:func:`audio_token_count`);
* each ``<|IMAGE|>`` becomes ``t * h * w / merge_size**2`` copies for the image's ``image_grid_thw``.

Audio: the processor pads every clip to the feature extractor's ``n_samples`` (five minutes) and returns
all those frames.  Here each clip is padded with zeros only as far as its mel frames need (at least
``n_fft`` samples past the longest clip, as far as ``n_samples``), and the frames are cut after the longest
clip's last: ``input_features[:, :, :T]`` and ``feature_attention_mask[:, :T]`` (int32) equal the
processor's, ``T`` the longest clip's frame count, and the frames past ``T`` (padding the model never
reads) are not sent.  A clip longer than ``n_samples`` is cut there, as the processor cuts it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from schedulers.front.processor import SAMPLE_RATE, ChatProcessor


def audio_token_count(mel_frames: int) -> int:
    """Audio tokens for ``mel_frames`` frames: the audio tower's two stride-2 reductions."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


class OmniProcessor(ChatProcessor):
    """Chat template + tokenizer + feature extractor + image processor of one checkpoint (module docstring)."""

    family = "Qwen2.5-Omni"

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
            device=self.device,
        )
        mask = features["attention_mask"]
        frames = int(mask.sum(-1).max())
        return features["input_features"][:, :, :frames], mask[:, :frames].to(torch.int32)

    def audio_token_count(self, mel_frames: int) -> int:
        return audio_token_count(mel_frames)
