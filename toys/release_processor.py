"""A released Qwen omni family's transformers processor, assembled from a checkpoint directory without video.

:func:`processor_without_video` builds ``processor_class`` (``Qwen3OmniMoeProcessor``,
``Qwen2_5OmniProcessor``) from the directory's tokenizer, Whisper feature extractor, the PIL Qwen2-VL
image processor and chat template, with a stand-in video processor: the constructor insists on the
torchvision video processor class, which does not import with the pinned CPU torch, and no test sends
video.  The processor's media token attributes are the tokenizer's.  :func:`media` picks a chat's audio and images
out for it.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


def media(messages: list[dict[str, Any]]) -> tuple[list[np.ndarray], list[Any]]:
    """The audio clips (float32) and images (as given) of transformers-style chat ``messages``, in order."""
    audio: list[np.ndarray] = []
    images: list[Any] = []
    for message in messages:
        content = message["content"]
        for part in content if isinstance(content, list) else []:
            if part["type"] == "audio":
                audio.append(np.asarray(part["audio"], dtype=np.float32))
            elif part["type"] == "image":
                images.append(part["image"])
    return audio, images


def processor_without_video(processor_class: Any, model_dir: str | Path, token_names: Iterable[str]) -> Any:
    """``processor_class`` of ``model_dir`` (module docstring); ``token_names`` the attributes it copies from
    the tokenizer (``audio_token``, ...)."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model_dir = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = processor_class.__new__(processor_class)
    processor.tokenizer = tokenizer
    processor.feature_extractor = WhisperFeatureExtractor.from_pretrained(model_dir)
    processor.image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    merge = processor.image_processor.merge_size
    processor.video_processor = types.SimpleNamespace(merge_size=merge, temporal_patch_size=2, model_input_names=[])
    processor.chat_template = json.loads((model_dir / "chat_template.json").read_text())["chat_template"]
    for name in token_names:
        setattr(processor, name, getattr(tokenizer, name))
    return processor


__all__ = ["media", "processor_without_video"]
