"""An OpenAI chat request read for an omni model's processor: its messages, their media, the client's knobs.

Inputs are what the HTTP layer hands a chat pipeline (:mod:`omnitrio.serve`): ``{"task": "chat",
"messages": [OpenAI messages], "modalities", "audio": {"voice", "format"} | None, "max_tokens",
"temperature", "seed", ...}``, or a bare prompt string (one user message).  Content parts:

* ``text``;
* ``input_audio``: base64 WAV of any rate or raw 24 kHz ``pcm16``, or Python ``{"array", "sample_rate"}``
  (:func:`schedulers.media.decode_audio`: 16 kHz audio as it came, other rates resampled to 16 kHz);
* ``image_url`` with a PNG/JPEG ``data:`` URL (never fetched), or Python ``{"type": "image", "image":
  HxWx3 array}``; images keep their size (a checkpoint's image processor resizes them);
* video parts are refused, as is any other malformed part.

Every error is a ``ValueError`` whose message starts with the field's path (``messages[1].content[2]``,
``max_tokens``, ``audio.voice``); :func:`client_error` turns it into the
:class:`~omnitrio.contract.InvalidRequest` (a 400) that names that field.  The arrays returned are new
and the caller's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnitrio.contract import InvalidRequest
from schedulers.media import decode_audio, read_image_url

OPENAI_VOICES = (
    "default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
)  # fmt: skip
"""OpenAI's voice names (and ``default``): each means a model's default speaker."""
VIDEO_PARTS = ("input_video", "video_url", "video")
MODALITIES = ("text", "audio")


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
        match message.get("content"):
            case None | str() as content:
                out.append({"role": message["role"], "content": content or ""})
            case list(content):
                parts = [_part(part, f"{where}.content[{j}]", audio, images) for j, part in enumerate(content)]
                out.append({"role": message["role"], "content": parts})
            case content:
                raise ValueError(f"{where}.content: must be a string or a list of parts, got {type(content).__name__}")
    return out, audio, images


def _part(part: Any, where: str, audio: list[np.ndarray], images: list[np.ndarray]) -> dict[str, Any]:
    match part:
        case {"type": "text", "text": str(words)}:
            return {"type": "text", "text": words}
        case {"type": "input_audio", "input_audio": dict(spec)}:
            audio.append(decode_audio(spec, f"{where}.input_audio"))
            return {"type": "audio"}
        case {"type": "image_url", "image_url": dict(spec)}:
            images.append(read_image_url(spec.get("url"), f"{where}.image_url.url"))
            return {"type": "image"}
        case {"type": "image", "image": image}:
            images.append(_rgb(image, f"{where}.image"))
            return {"type": "image"}
        case {"type": str(kind)} if kind in VIDEO_PARTS:
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


def number(inputs: Any, key: str, kind: type, minimum: float | None = None) -> Any:
    """``inputs[key]`` as ``kind`` (``int`` or ``float``), None when absent or null; a ``ValueError``
    naming ``key`` for a wrong type or a value under ``minimum``."""
    value = inputs.get(key) if isinstance(inputs, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key}: must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value!r}")
    return kind(value)


def spoken(inputs: Any) -> tuple[bool, Any]:
    """Whether the answer is spoken (``"audio"`` in ``modalities``; text only when absent) and the voice
    ``audio.voice`` names (None when none, unchecked: the family knows its speakers)."""
    request = inputs if isinstance(inputs, dict) else {}
    modalities = request.get("modalities") or ["text"]
    if not isinstance(modalities, list | tuple) or not set(modalities) <= set(MODALITIES):
        raise ValueError(f"modalities: must be a subset of {list(MODALITIES)}, got {modalities!r}")
    spec = request.get("audio")
    return "audio" in modalities, spec.get("voice") if isinstance(spec, dict) else None


def client_error(exc: ValueError) -> InvalidRequest:
    """The client's mistake ``exc`` as a 400 naming the field its message starts with (module docstring)."""
    if isinstance(exc, InvalidRequest):
        return exc
    field = str(exc).split(":", 1)[0]
    return InvalidRequest(str(exc), param=field if " " not in field else None)


__all__ = ["MODALITIES", "OPENAI_VOICES", "VIDEO_PARTS", "chat_messages", "client_error", "number", "spoken"]
