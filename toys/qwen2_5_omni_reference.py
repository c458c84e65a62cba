"""transformers' Qwen2.5-Omni processor and the media the tiny checkpoints' answers depend on, for the tests
and the benches alike.

* :func:`reference_processor`: ``Qwen2_5OmniProcessor`` itself, assembled from a checkpoint directory without
  its torchvision video processor (its constructor insists on one; the CPU torch pin has no torchvision);
  :func:`reference_inputs`: its tensors for a chat;
* :func:`clip`, :func:`picture`: media whose content the tiny checkpoints' answers depend on; :func:`wav`,
  :func:`png`: them as a chat request carries them, :func:`pcm16`: a clip as the model reads it from a WAV.
"""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toys.release_processor import media, processor_without_video

TOKEN_NAMES = (
    "image_token",
    "audio_token",
    "video_token",
    "image_token_id",
    "audio_token_id",
    "video_token_id",
    "vision_bos_token",
    "vision_eos_token",
    "audio_bos_token",
    "audio_eos_token",
)


def reference_processor(model_dir: Path) -> Any:
    """``Qwen2_5OmniProcessor`` of ``model_dir`` without its video processor (module docstring)."""
    from transformers import Qwen2_5OmniProcessor

    return processor_without_video(Qwen2_5OmniProcessor, model_dir, TOKEN_NAMES)


def reference_inputs(processor: Any, messages: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The processor's tensors for ``messages`` (template, then text and media in order)."""
    audio, images = media(messages)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=text, audio=audio or None, images=images or None, return_tensors="pt")
    return dict(out)


def clip(frequency: float, seconds: float = 1.0) -> np.ndarray:
    """A modulated tone at 16 kHz: its pitch changes the tiny checkpoints' answers."""
    t = np.arange(int(16_000 * seconds)) / 16_000
    return (0.3 * np.sin(2 * np.pi * frequency * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def wav(samples: np.ndarray, rate: int = 16_000) -> str:
    """``samples`` as a base64 PCM16 WAV file at ``rate``."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return base64.b64encode(buffer.getvalue()).decode()


def pcm16(samples: np.ndarray) -> np.ndarray:
    """What a 16 kHz PCM16 WAV of ``samples`` holds, as the model reads it: int16 / 32768."""
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0


def png(image: Any) -> str:
    """A PIL ``image`` as a PNG ``data:`` URL."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def picture(seed: int, height: int = 56, width: int = 56) -> Any:
    """A random RGB PIL image."""
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8))
