"""A Qwen omni checkpoint's processor without video: tokenizer, feature extractor, image processor, template.

transformers' omni processors (``Qwen2_5OmniProcessor``, ``Qwen3OmniMoeProcessor``) cannot be built with
the CPU torch pin (their constructors insist on the torchvision video processor), so
:class:`ChatProcessor` assembles a checkpoint's own parts: its tokenizer (``Qwen2Tokenizer``, which names
the placeholders as ``audio_token``, ``image_token``, ``video_token``), ``WhisperFeatureExtractor``, the
Qwen2-VL image processor (the PIL one: no torchvision) and its chat template
(:func:`read_chat_template`), and expands each placeholder into as many copies as its clip or image has
tokens (:func:`expand_placeholders`), in order, as those processors do:

* audio: a family's subclass gives the clips' features (:meth:`ChatProcessor.audio_features`: how it
  pads them is the family's processor's rule) and the tokens per clip of ``n`` mel frames
  (:meth:`ChatProcessor.audio_token_count`);
* images: ``t * h * w / merge_size**2`` copies for the image's ``image_grid_thw``.

``device`` is where the feature extractor computes the audio's log-mel spectrogram (a subclass passes it
on); what a call returns is on the CPU, float32.  A prompt with video is a ``ValueError``.  Instances are
read-only after construction; calls from several threads are safe as far as the tokenizer's are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import torch

# The classes themselves, not transformers' Auto* machinery: a stage imports what it runs, at the top
# (a fork server preloads it once for every stage process).
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.whisper.feature_extraction_whisper import WhisperFeatureExtractor

from schedulers.checkpoints import CheckpointError

SAMPLE_RATE = 16_000
_TOKENS = ("audio_token", "image_token", "video_token")


class ChatProcessor:
    """Chat template + tokenizer + feature extractor + image processor of one checkpoint (module docstring).

    Subclasses set :attr:`family` and define :meth:`audio_features` and :meth:`audio_token_count`."""

    family: ClassVar[str] = "Qwen omni"
    """The family's name, for error messages."""

    def __init__(
        self, tokenizer: Any, feature_extractor: Any, image_processor: Any, chat_template: str, device: str = "cpu"
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.audio_token, self.image_token, self.video_token = (getattr(tokenizer, name) for name in _TOKENS)
        if feature_extractor.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"feature extractor: sampling_rate {feature_extractor.sampling_rate}, expected 16000")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, device: str = "cpu") -> Self:
        """Read the parts from a checkpoint directory; a missing or unreadable part is a CheckpointError.
        ``device``: where the audio features are computed (module docstring)."""
        directory = Path(model_dir)
        try:
            tokenizer = Qwen2Tokenizer.from_pretrained(directory)
            feature_extractor = WhisperFeatureExtractor.from_pretrained(directory)
            image_processor = Qwen2VLImageProcessorPil.from_pretrained(directory)
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{directory}: cannot load the processor ({exc})") from None
        for name in _TOKENS:
            if not isinstance(getattr(tokenizer, name, None), str):
                raise CheckpointError(f"{directory}: the tokenizer has no {name} ({cls.family}'s special tokens)")
        return cls(tokenizer, feature_extractor, image_processor, read_chat_template(directory, tokenizer), device)

    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt text of chat ``messages`` (transformers' chat format), generation prompt appended."""
        text = self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def audio_features(self, audio: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_features [n_clips, mels, T], feature_attention_mask [n_clips, T])`` of 16 kHz clips."""
        raise NotImplementedError

    def audio_token_count(self, mel_frames: int) -> int:
        """The audio tokens of a clip of ``mel_frames`` frames."""
        raise NotImplementedError

    def __call__(
        self, text: str, audio: Sequence[np.ndarray] = (), images: Sequence[Any] = ()
    ) -> dict[str, torch.Tensor]:
        """Tensors for one prompt, as the family's processor gives ``(text, audio, images, return_tensors="pt")``.

        ``input_ids`` / ``attention_mask`` ``[1, P]``; with audio ``input_features`` and
        ``feature_attention_mask`` (:meth:`audio_features`); with images ``pixel_values`` and
        ``image_grid_thw`` ``[n_images, 3]``.  ``audio`` is float32 mono at 16 kHz; the placeholders in
        ``text`` must match the media in number and order, else ``ValueError``.
        """
        if self.video_token in text:
            raise ValueError("video input is not supported by this server (audio and images are)")
        out: dict[str, torch.Tensor] = {}
        counts: dict[str, list[int]] = {self.audio_token: [], self.image_token: []}
        if audio:
            features, mask = self.audio_features(audio)
            out["input_features"], out["feature_attention_mask"] = features, mask
            counts[self.audio_token] = [self.audio_token_count(int(n)) for n in mask.sum(-1)]
        if images:
            pixels = self.image_processor(images=list(images), return_tensors="pt")
            out["pixel_values"] = pixels["pixel_values"]
            out["image_grid_thw"] = pixels["image_grid_thw"]
            merge = self.image_processor.merge_size**2
            counts[self.image_token] = [int(grid.prod()) // merge for grid in pixels["image_grid_thw"]]
        tokens = self.tokenizer(expand_placeholders(text, counts), return_tensors="pt")
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"], **out}


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


def read_chat_template(directory: Path, tokenizer: Any) -> str:
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


__all__ = ["SAMPLE_RATE", "ChatProcessor", "expand_placeholders", "read_chat_template"]
