"""The preprocessing stage: chat inputs → the checkpoint processor's tensors, the encoders to run, the knobs.

Inputs are what the HTTP layer hands a chat pipeline (:mod:`omnitrio.serve`): ``{"task": "chat",
"messages": [OpenAI messages], "modalities", "audio": {"voice", "format"} | None, "max_tokens",
"temperature", ...}``, or a bare prompt string (one user message).  Content parts:

* ``text``; ``input_audio`` (base64 WAV of any rate or raw 24 kHz pcm16, or Python ``{"array",
  "sample_rate"}``), resampled to the feature extractor's 16 kHz (:func:`schedulers.media.decode_audio`);
* ``image_url`` with a PNG/JPEG ``data:`` URL (never fetched), or Python ``{"type": "image", "image":
  HxWx3 array}``; images keep their size (the image processor resizes them as the checkpoint says);
* video parts are refused: ``ValueError`` (a 400), as is any other malformed input, naming the part.

``audio.voice`` picks the talker's speaker (:func:`resolve_speaker`).  The output payload's data is a
:class:`~schedulers.qwen3_omni.handoffs.Preprocessed` (:mod:`schedulers.qwen3_omni.graph` says what each
branch receives of it).

``device`` is where the feature extractor computes the audio's log-mel spectrogram; the stage has no
weights, so no ``dtype``: what it hands on is on the CPU, features and pixels in float32, and each
encoder casts them to its own dtype (as transformers' towers do).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.devices import Placement
from schedulers.media import decode_audio, read_image_url
from schedulers.qwen3_omni.checkpoint import load_config, preflight, require_model_dir, speakers
from schedulers.qwen3_omni.front.processor import OmniProcessor
from schedulers.qwen3_omni.front.warm_up import preprocess_warm_up
from schedulers.qwen3_omni.graph import AUDIO_ENCODER, IMAGE_ENCODER
from schedulers.qwen3_omni.handoffs import Knobs, Preprocessed
from schedulers.simple import SimpleScheduler

# OpenAI's voice names (and "default") all mean the checkpoint's default speaker.
OPENAI_VOICES = (
    "default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
)  # fmt: skip
DEFAULT_SPEAKER = "ethan"  # transformers' generate default, when the checkpoint has it
_VIDEO_PARTS = ("input_video", "video_url", "video")


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


def chat_messages(inputs: Any) -> tuple[list[dict[str, Any]], list[np.ndarray], list[np.ndarray]]:
    """OpenAI chat inputs → (transformers chat messages, audio clips at 16 kHz, RGB uint8 images), in order."""
    if isinstance(inputs, str):
        return [{"role": "user", "content": inputs}], [], []
    if not isinstance(inputs, dict) or inputs.get("task", "chat") != "chat":
        raise ValueError(f"this pipeline serves chat requests (or a prompt string), got {type(inputs).__name__}")
    messages = inputs.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    out: list[dict[str, Any]] = []
    audio: list[np.ndarray] = []
    images: list[np.ndarray] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: must be a dict with a string 'role'")
        content = message.get("content")
        if content is None or isinstance(content, str):
            out.append({"role": message["role"], "content": content or ""})
        elif isinstance(content, list):
            parts = [_part(part, f"{where}.content[{j}]", audio, images) for j, part in enumerate(content)]
            out.append({"role": message["role"], "content": parts})
        else:
            raise ValueError(f"{where}.content: must be a string or a list of parts, got {type(content).__name__}")
    return out, audio, images


def _part(part: Any, where: str, audio: list[np.ndarray], images: list[np.ndarray]) -> dict[str, Any]:
    match part:
        case {"type": "text", "text": str(text)}:
            return {"type": "text", "text": text}
        case {"type": "input_audio", "input_audio": dict(spec)}:
            audio.append(decode_audio(spec, f"{where}.input_audio"))
            return {"type": "audio"}
        case {"type": "image_url", "image_url": dict(spec)}:
            images.append(read_image_url(spec.get("url"), f"{where}.image_url.url"))
            return {"type": "image"}
        case {"type": "image", "image": image}:
            images.append(_rgb(image, f"{where}.image"))
            return {"type": "image"}
        case {"type": str(kind)} if kind in _VIDEO_PARTS:
            raise ValueError(f"{where}: video input is not supported by this model server (audio and images are)")
        case _:
            raise ValueError(f"{where}: unsupported part; expected text, input_audio or image_url")


def _rgb(image: Any, where: str) -> np.ndarray:
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 1:
        raise ValueError(f"{where}: must be an HxWx3 RGB array, got shape {pixels.shape}")
    if pixels.dtype != np.uint8:
        pixels = np.clip(np.round(pixels.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    return pixels


def _knob(inputs: Any, key: str, kind: type, minimum: float) -> Any:
    value = inputs.get(key) if isinstance(inputs, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key}: must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value!r}")
    return kind(value)


class Preprocessor:
    """One checkpoint's processor and speakers: :meth:`__call__` turns raw inputs into the stage's output."""

    def __init__(self, model_dir: str | Path, default_speaker_name: str | None = None, device: str = "cpu") -> None:
        self.processor = OmniProcessor.from_pretrained(model_dir, device)
        self.speakers = tuple(speakers(load_config(model_dir)))
        self.default_speaker = default_speaker(self.speakers, default_speaker_name) if self.speakers else None

    def __call__(self, inputs: Any) -> Preprocessed:
        messages, audio, images = chat_messages(inputs)
        modalities = (inputs.get("modalities") if isinstance(inputs, dict) else None) or ["text"]
        if not isinstance(modalities, list | tuple) or not set(modalities) <= {"text", "audio"}:
            raise ValueError(f"modalities: must be a subset of ['text', 'audio'], got {modalities!r}")
        want_audio = "audio" in modalities
        spec = inputs.get("audio") if isinstance(inputs, dict) else None
        voice = spec.get("voice") if isinstance(spec, dict) else None
        speaker = None
        if want_audio or voice is not None:
            if self.default_speaker is None:
                raise ValueError("modalities: this checkpoint has no talker speakers, so it cannot answer in audio")
            speaker = resolve_speaker(voice, self.speakers, self.default_speaker)
        tensors = self.processor(self.processor.render(messages), audio=audio, images=images)
        knobs = Knobs(
            max_new_tokens=_knob(inputs, "max_tokens", int, 1),
            temperature=_knob(inputs, "temperature", float, 0.0),
            speaker=speaker,
            want_audio=want_audio,
        )
        return Preprocessed(
            input_ids=tensors["input_ids"][0],
            encoders=(AUDIO_ENCODER,) * bool(audio) + (IMAGE_ENCODER,) * bool(images),
            knobs=knobs,
            input_features=tensors.get("input_features"),
            feature_attention_mask=tensors.get("feature_attention_mask"),
            pixel_values=tensors.get("pixel_values"),
            image_grid_thw=tensors.get("image_grid_thw"),
        )


def create_preprocess_stage(
    *, model_dir: str | None = None, default_speaker: str | None = None, max_concurrency: int = 1, device: str = "cpu"
) -> SimpleScheduler:
    """Preprocessing (module docstring); bad inputs fail the request with a ``ValueError`` (a 400)."""
    placement = Placement.of("preprocess", device)
    torch.set_num_threads(1)
    preprocessor = Preprocessor(require_model_dir(model_dir), default_speaker, str(placement.device))

    def preprocess(payload: StagePayload) -> StagePayload:
        data = payload.data
        raw = data["raw_inputs"] if isinstance(data, dict) and "raw_inputs" in data else data
        try:
            payload.data = preprocessor(raw)
        except InvalidRequest:
            raise
        except ValueError as exc:  # the client's input: a 400 naming the field its message starts with
            field = str(exc).split(":", 1)[0]
            raise InvalidRequest(str(exc), param=field if " " not in field else None) from None
        return payload

    return SimpleScheduler(preprocess, max_concurrency=max_concurrency, warm_up=preprocess_warm_up(preprocessor))


create_preprocess_stage.preflight = preflight  # type: ignore[attr-defined]
