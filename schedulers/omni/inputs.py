"""Chat inputs → one prompt text plus the audio clips and images it carries, decoded.

What the HTTP layer hands a pipeline for chat (see ``omnitrio.serve``) is OpenAI's message list.
:func:`parse_chat` reads it; each content part is one of:

* ``{"type": "text", "text": str}`` (or a plain string content);
* ``{"type": "input_audio", "input_audio": {"data": base64, "format": "wav" | "pcm16"}}``: a WAV
  file of any rate (mono or the mean of its channels), or raw little-endian PCM16 mono at 24 kHz
  (OpenAI's realtime format); Python callers may pass ``{"array": float samples, "sample_rate": int}``
  instead of ``data``.  Every clip becomes float32 mono at 16 kHz;
* ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``: a PNG or JPEG data
  URL, decoded with Pillow; Python callers may pass ``{"type": "image", "image": HxWx3 array}``
  (uint8, or float in [0, 1]).  Every image becomes float32 RGB ``[3, size, size]`` in [0, 1].

Remote URLs are refused (the pipeline never fetches).  Every error is a ``ValueError`` that names
the message and part, e.g. ``messages[1].content[2].input_audio.format``.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

AUDIO_RATE = 16_000
PCM16_RATE = 24_000  # raw "pcm16" parts: OpenAI's realtime rate
MAX_AUDIO_SECONDS = 60.0


@attrs.frozen
class ChatTurn:
    """What one chat request asks: the prompt text, its media, and the generation knobs."""

    prompt: str
    audio: tuple[np.ndarray, ...] = ()
    images: tuple[np.ndarray, ...] = ()
    modalities: tuple[str, ...] = ("text",)
    max_tokens: int | None = None
    temperature: float | None = None

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.modalities


def wants_audio(inputs: Any) -> bool:
    """Whether a request's raw inputs ask for spoken output (chat ``modalities`` names ``audio``)."""
    return isinstance(inputs, dict) and "audio" in (inputs.get("modalities") or ())


def parse_chat(inputs: Any, *, image_size: int = 32) -> ChatTurn:
    """Read raw pipeline inputs: a chat dict (see the module docstring) or a bare prompt string."""
    if isinstance(inputs, str):
        return ChatTurn(prompt=f"user: {inputs}\nassistant:")
    if not isinstance(inputs, dict) or inputs.get("task", "chat") != "chat":
        raise ValueError(f"omni pipeline serves chat requests (or a prompt string), got {_describe(inputs)}")
    messages = inputs.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    lines: list[str] = []
    audio: list[np.ndarray] = []
    images: list[np.ndarray] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: must be a dict with a string 'role'")
        texts = _read_content(message.get("content"), where, audio, images, image_size)
        lines.append(f"{message['role']}: {' '.join(t for t in texts if t)}")
    modalities = inputs.get("modalities") or ["text"]
    if not isinstance(modalities, list | tuple) or not set(modalities) <= {"text", "audio"}:
        raise ValueError(f"modalities: must be a subset of ['text', 'audio'], got {modalities!r}")
    return ChatTurn(
        prompt="\n".join([*lines, "assistant:"]),
        audio=tuple(audio),
        images=tuple(images),
        modalities=tuple(modalities),
        max_tokens=_optional_int(inputs.get("max_tokens"), "max_tokens"),
        temperature=_optional_float(inputs.get("temperature"), "temperature"),
    )


def _read_content(
    content: Any, where: str, audio: list[np.ndarray], images: list[np.ndarray], image_size: int
) -> list[str]:
    match content:
        case None:
            return []
        case str():
            return [content]
        case list():
            pass
        case _:
            raise ValueError(f"{where}.content: must be a string or a list of parts, got {type(content).__name__}")
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        match part:
            case {"type": "text", "text": str(text)}:
                texts.append(text)
            case {"type": "input_audio", "input_audio": dict(spec)}:
                audio.append(decode_audio(spec, f"{at}.input_audio"))
            case {"type": "image_url", "image_url": dict(spec)}:
                images.append(decode_image_url(spec.get("url"), f"{at}.image_url.url", image_size))
            case {"type": "image", "image": image}:
                images.append(image_array(image, f"{at}.image", image_size))
            case _:
                raise ValueError(f"{at}: unsupported part {_describe(part)}; expected text, input_audio or image_url")
    return texts


def decode_audio(spec: dict[str, Any], where: str) -> np.ndarray:
    """An ``input_audio`` object → float32 mono samples at 16 kHz."""
    if "array" in spec:
        rate = spec.get("sample_rate", AUDIO_RATE)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ValueError(f"{where}.sample_rate: must be a positive integer, got {rate!r}")
        samples = np.asarray(spec["array"], dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"{where}.array: must be mono (one dimension), got shape {samples.shape}")
        return _limit(resample(samples, rate, AUDIO_RATE), where)
    raw = _b64(spec.get("data"), f"{where}.data")
    match spec.get("format", "wav"):
        case "wav":
            samples, rate = _read_wav(raw, f"{where}.data")
        case "pcm16" | "pcm":
            if len(raw) % 2:
                raise ValueError(f"{where}.data: pcm16 needs an even number of bytes, got {len(raw)}")
            samples, rate = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0, PCM16_RATE
        case other:
            raise ValueError(f"{where}.format: {other!r} is not supported; use 'wav' or 'pcm16'")
    return _limit(resample(samples, rate, AUDIO_RATE), where)


def _read_wav(raw: bytes, where: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(raw)) as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{where}: not a readable WAV file ({exc})") from None
    match width:
        case 2:
            samples = np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
        case 4:
            samples = np.frombuffer(frames, "<i4").astype(np.float32) / 2147483648.0
        case 1:
            samples = (np.frombuffer(frames, np.uint8).astype(np.float32) - 128.0) / 128.0
        case _:
            raise ValueError(f"{where}: WAV sample width {width * 8} bits is not supported")
    return samples.reshape(-1, channels).mean(axis=1), rate


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling (soxr) to ``target`` Hz, float32."""
    if rate == target or not len(samples):
        return samples.astype(np.float32, copy=False)
    import soxr

    return np.asarray(soxr.resample(samples, rate, target), dtype=np.float32)


def _limit(samples: np.ndarray, where: str) -> np.ndarray:
    if len(samples) > MAX_AUDIO_SECONDS * AUDIO_RATE:
        raise ValueError(
            f"{where}: audio is {len(samples) / AUDIO_RATE:.1f} s long; the limit is {MAX_AUDIO_SECONDS} s"
        )
    return samples


def decode_image_url(url: Any, where: str, size: int) -> np.ndarray:
    """A PNG/JPEG ``data:`` URL → float32 RGB ``[3, size, size]`` in [0, 1]."""
    from PIL import Image

    rgb = Image.fromarray(read_image_url(url, where)).resize((size, size), Image.Resampling.BILINEAR)
    pixels = np.asarray(rgb, dtype=np.float32) / 255.0
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def read_image_url(url: Any, where: str) -> np.ndarray:
    """A PNG/JPEG ``data:`` URL → its pixels, uint8 RGB ``[height, width, 3]`` (not resized)."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ValueError(f"{where}: only data: URLs are accepted (the pipeline never fetches), got {url!r:.60}")
    header, _, body = url.partition(",")
    if not header.endswith(";base64"):
        raise ValueError(f"{where}: the data URL must be base64-encoded ('data:image/png;base64,...')")
    raw = _b64(body, where)
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ValueError(
            f"{where}: decoding images needs Pillow (pip install pillow); or pass {{'type': 'image', 'image': array}}"
        ) from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"{where}: not a readable image ({exc})") from None


def image_array(image: Any, where: str, size: int) -> np.ndarray:
    """An ``HxWx3`` array (uint8 or float in [0, 1]) → float32 ``[3, size, size]`` (nearest-neighbour)."""
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 1:
        raise ValueError(f"{where}: must be an HxWx3 RGB array, got shape {pixels.shape}")
    values = pixels.astype(np.float32) / (255.0 if pixels.dtype == np.uint8 else 1.0)
    rows = np.arange(size) * pixels.shape[0] // size
    cols = np.arange(size) * pixels.shape[1] // size
    return np.ascontiguousarray(np.clip(values[rows][:, cols], 0.0, 1.0).transpose(2, 0, 1))


def _b64(data: Any, where: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ValueError(f"{where}: must be a non-empty base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{where}: invalid base64 ({exc})") from None


def _optional_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: must be a positive integer, got {value!r}")
    return value


def _optional_float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: must be a number >= 0, got {value!r}")
    return float(value)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return type(value).__name__


__all__: Sequence[str] = [
    "AUDIO_RATE",
    "ChatTurn",
    "decode_audio",
    "decode_image_url",
    "parse_chat",
    "read_image_url",
    "wants_audio",
]
