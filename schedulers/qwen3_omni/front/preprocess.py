"""The preprocessing stage: chat inputs → the checkpoint processor's tensors, the encoders to run, the knobs.

The request is read by :mod:`schedulers.front.chat` (text, ``input_audio`` at any rate resampled to the
feature extractor's 16 kHz, ``image_url`` data URLs; video parts and any other malformed input are a
``ValueError`` naming the part, which the stage answers as a 400).

``audio.voice`` picks the talker's speaker (:func:`resolve_speaker`).  The output payload's data is a
:class:`~schedulers.front.handoffs.Preprocessed` (:mod:`schedulers.qwen3_omni.graph` says what each
branch receives of it).

``device`` is where the feature extractor computes the audio's log-mel spectrogram; the stage has no
weights, so no ``dtype``: what it hands on is on the CPU, features and pixels in float32, and each
encoder casts them to its own dtype (as transformers' towers do).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.front.chat import OPENAI_VOICES, chat_messages, number, spoken
from schedulers.front.handoffs import Preprocessed
from schedulers.front.stages import create_preprocess_stage as preprocess_stage
from schedulers.front.stages import preprocessed_fields
from schedulers.front.warm_up import preprocess_warm_up
from schedulers.qwen3_omni.checkpoint import load_config, preflight, require_model_dir, speakers
from schedulers.qwen3_omni.front.processor import OmniProcessor
from schedulers.qwen3_omni.handoffs import Knobs
from schedulers.simple import SimpleScheduler

DEFAULT_SPEAKER = "ethan"  # transformers' generate default, when the checkpoint has it


def default_speaker(names: Sequence[str], preferred: str | None = None) -> str:
    """``preferred`` (when given), else ``ethan`` if the checkpoint has it, else its first speaker."""
    if preferred is not None:
        if preferred.lower() not in names:
            raise ValueError(f"default_speaker {preferred!r} is not a speaker of this checkpoint: {', '.join(names)}")
        return preferred.lower()
    return DEFAULT_SPEAKER if DEFAULT_SPEAKER in names else names[0]


def resolve_speaker(voice: Any, names: Sequence[str], default: str) -> str:
    """``voice`` → a checkpoint speaker: OpenAI's names → ``default``; a speaker name (any case) → itself."""
    if voice is None:
        return default
    if not isinstance(voice, str):
        raise ValueError(f"audio.voice: must be a string, got {type(voice).__name__}")
    if voice.lower() in names:
        return voice.lower()
    if voice.lower() in OPENAI_VOICES:
        return default
    raise ValueError(
        f"audio.voice: {voice!r} is not a voice of this model; use one of {', '.join(names)} "
        f"(or an OpenAI voice name for {default})"
    )


class Preprocessor:
    """One checkpoint's processor and speakers: :meth:`__call__` turns raw inputs into the stage's output."""

    def __init__(self, model_dir: str | Path, default_speaker_name: str | None = None, device: str = "cpu") -> None:
        self.processor = OmniProcessor.from_pretrained(model_dir, device)
        self.speakers = tuple(speakers(load_config(model_dir)))
        self.default_speaker = default_speaker(self.speakers, default_speaker_name) if self.speakers else None

    def __call__(self, inputs: Any) -> Preprocessed:
        messages, audio, images = chat_messages(inputs)
        want_audio, voice = spoken(inputs)
        speaker = None
        if want_audio or voice is not None:
            if self.default_speaker is None:
                raise ValueError("modalities: this checkpoint has no talker speakers, so it cannot answer in audio")
            speaker = resolve_speaker(voice, self.speakers, self.default_speaker)
        tensors = self.processor(self.processor.render(messages), audio=audio, images=images)
        knobs = Knobs(
            max_new_tokens=number(inputs, "max_tokens", int, 1),
            temperature=number(inputs, "temperature", float, 0.0),
            speaker=speaker,
            want_audio=want_audio,
        )
        return Preprocessed(knobs=knobs, **preprocessed_fields(tensors))


@checked_by(preflight)
def create_preprocess_stage(
    *, model_dir: str | None = None, default_speaker: str | None = None, max_concurrency: int = 1, device: str = "cpu"
) -> SimpleScheduler:
    """Preprocessing (module docstring); bad inputs fail the request with a ``ValueError`` (a 400)."""
    placement = Placement.of("preprocess", device)
    torch.set_num_threads(1)
    preprocessor = Preprocessor(require_model_dir(model_dir), default_speaker, str(placement.device))
    return preprocess_stage(preprocessor, max_concurrency=max_concurrency, warm_up=preprocess_warm_up(preprocessor))
