"""What the front's stages warm before they report ready: each input path a first request would take.

* :func:`preprocess_warm_up`: the processor on a text chat, on one with an audio clip and on one with an
  image (the chat template, the feature extractor, the image processor, each first called);
* :func:`audio_warm_up` / :func:`image_warm_up`: the audio and vision towers on a short clip's features /
  a small image's patches.

See :mod:`schedulers.warm_up` for how a stage runs them.
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from schedulers.warm_up import WarmUp

RATE = 16_000


def _wav(seconds: float = 1.0) -> str:
    t = np.arange(int(seconds * RATE)) / RATE
    pcm = (0.2 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return base64.b64encode(out.getvalue()).decode()


def _chat(content: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"task": "chat", "messages": messages, "modalities": ["text", "audio"], "max_tokens": 1}


def preprocess_warm_up(preprocess: Callable[[Any], object]) -> WarmUp:
    """``preprocess`` (raw chat inputs → the stage's output) on a text, an audio and an image chat."""
    audio = {"type": "input_audio", "input_audio": {"data": _wav(), "format": "wav"}}
    image = {"type": "image", "image": np.full((56, 56, 3), 128, np.uint8)}
    return (
        WarmUp()
        .step("text", lambda: preprocess(_chat("Hello.")))
        .step("audio", lambda: preprocess(_chat([audio, {"type": "text", "text": "What is this?"}])))
        .step("image", lambda: preprocess(_chat([image, {"type": "text", "text": "What is this?"}])))
    )


def audio_warm_up(encode: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], object], mel_bins: int) -> WarmUp:
    """The audio tower's ``encode`` on one second of (silent) features."""
    frames = RATE // 160
    features, mask = torch.zeros(1, mel_bins, frames), torch.ones(1, frames, dtype=torch.long)
    return WarmUp().step("audio", lambda: encode([(features, mask)]))


def image_warm_up(encode: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], object], config: Any) -> WarmUp:
    """The vision tower's ``encode`` on the smallest image it takes (one merged patch)."""
    merge = config.spatial_merge_size
    grid = torch.tensor([[1, merge, merge]])
    patch = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.zeros(merge * merge, patch)
    return WarmUp().step("image", lambda: encode([(pixels, grid)]))
