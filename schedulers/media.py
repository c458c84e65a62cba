"""Chat media at the API edge: an OpenAI ``input_audio`` part → 16 kHz samples, an image URL → its pixels.

Every model family that hears or sees a chat reads its parts through these (the cascade's ASR, each omni
model's preprocess stage):

* :func:`decode_audio`: ``{"data": base64, "format": "wav" | "pcm16"}`` — a WAV file of any rate (mono, or
  the mean of its channels; 8, 16 or 32-bit) or raw little-endian PCM16 mono at 24 kHz (OpenAI's
  realtime format) — or, from Python, ``{"array": float samples, "sample_rate": int}``; always float32
  mono at :data:`AUDIO_RATE` (16 kHz), at most :data:`MAX_AUDIO_SECONDS` long;
* :func:`read_image_url`: a PNG or JPEG ``data:`` URL → uint8 RGB ``[height, width, 3]``, not resized.
  Remote URLs are refused: a pipeline never fetches.

Every error is a ``ValueError`` whose message starts with the ``where`` the caller passed (the part's
path in the request, e.g. ``messages[1].content[2].input_audio.format``), so the HTTP layer can answer
a 400 naming the field.  Outputs are new arrays the caller owns.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave
from typing import Any

import numpy as np

from schedulers.speech.audio import resample

AUDIO_RATE = 16_000
"""The rate :func:`decode_audio` returns (what speech encoders' feature extractors take)."""
PCM16_RATE = 24_000
"""The rate of raw ``pcm16`` parts: OpenAI's realtime rate."""
MAX_AUDIO_SECONDS = 60.0


def decode_audio(spec: dict[str, Any], where: str) -> np.ndarray:
    """An ``input_audio`` object → float32 mono samples at 16 kHz (module docstring)."""
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


def _limit(samples: np.ndarray, where: str) -> np.ndarray:
    if len(samples) > MAX_AUDIO_SECONDS * AUDIO_RATE:
        raise ValueError(
            f"{where}: audio is {len(samples) / AUDIO_RATE:.1f} s long; the limit is {MAX_AUDIO_SECONDS} s"
        )
    return samples


def _b64(data: Any, where: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ValueError(f"{where}: must be a non-empty base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{where}: invalid base64 ({exc})") from None


__all__ = ["AUDIO_RATE", "MAX_AUDIO_SECONDS", "PCM16_RATE", "decode_audio", "read_image_url", "resample"]
