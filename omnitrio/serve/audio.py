"""Audio at the API edge: PCM16 bytes, WAV framing, resampling, base64, file decoding.

Pipelines hand the server audio as ``{"pcm": array, "sample_rate": int}`` where ``array`` is mono
int16, or float in [-1, 1] (numpy, or anything ``numpy.asarray`` accepts, e.g. a CPU tensor). Clients
get little-endian PCM16 mono. :class:`PcmStream` turns a sequence of such chunks into PCM16 at one
output rate with a *stateful* resampler (soxr), so chunk boundaries add no clicks and the total length
is exact once :meth:`PcmStream.flush` is called; int16 chunks already at the output rate pass through
sample for sample.
"""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import soxr

REALTIME_RATE = 24_000  # chat and realtime audio, and OpenAI's `pcm` speech format
TRANSCRIBE_RATE = 16_000  # what pipelines receive for transcription and realtime input
_STREAMING_SIZE = 0xFFFFFFFF  # WAV size fields when the length is not known yet


class AudioFormatError(ValueError):
    """Audio a client or a pipeline handed over cannot be used; the message says why."""


def _mono(pcm: Any) -> np.ndarray:
    """A 1-D array of the samples (1-D, or 2-D with one channel)."""
    array = np.asarray(pcm)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise AudioFormatError(f"audio must be mono (1-D), got an array of shape {array.shape}")
    return array


def _is_int16(array: np.ndarray) -> bool:
    return array.dtype.kind == "i" and array.dtype.itemsize == 2


def to_float32(pcm: Any) -> np.ndarray:
    """Mono float32 in [-1, 1] from an int16 or float array (1-D, or 2-D with one channel)."""
    array = _mono(pcm)
    match array.dtype.kind:
        case "i" if array.dtype.itemsize == 2:
            return array.astype(np.float32) / 32768.0
        case "f":
            return array.astype(np.float32, copy=False)
        case _:
            raise AudioFormatError(f"audio samples must be int16 or float, got {array.dtype}")


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Little-endian PCM16 bytes; values outside [-1, 1] are clipped, not wrapped."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Float32 samples from little-endian PCM16 bytes (an odd byte count is an error)."""
    if len(data) % 2:
        raise AudioFormatError(f"PCM16 audio must have an even number of bytes, got {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot high-quality resampling of a whole float32 signal."""
    if in_rate == out_rate or samples.size == 0:
        return samples.astype(np.float32, copy=False)
    return soxr.resample(samples, in_rate, out_rate).astype(np.float32, copy=False)


class PcmStream:
    """Chunks of pipeline audio in, PCM16 bytes at ``out_rate`` out, resampled without seams.

    ``out_rate=None`` keeps the rate of the first chunk (``rate`` tells it once known). One
    instance serves one response; it is not thread-safe.
    """

    def __init__(self, out_rate: int | None = None) -> None:
        self.rate = out_rate
        self._in_rate: int | None = None
        self._resampler: soxr.ResampleStream | None = None

    def push(self, chunk: Mapping[str, Any]) -> bytes:
        """PCM16 for one ``{"pcm", "sample_rate"}`` chunk (may be shorter while the resampler fills)."""
        try:
            pcm, in_rate = chunk["pcm"], int(chunk["sample_rate"])
        except (KeyError, TypeError) as exc:
            raise AudioFormatError(
                f"an audio chunk must be a dict with 'pcm' and 'sample_rate', got {chunk!r:.80}"
            ) from exc
        array = _mono(pcm)
        samples = to_float32(array)
        if self.rate is None:
            self.rate = in_rate
        out = b""
        if in_rate != self._in_rate:
            out = self.flush()
            self._in_rate = in_rate
            self._resampler = None if in_rate == self.rate else soxr.ResampleStream(in_rate, self.rate, 1)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        elif _is_int16(array):
            return out + array.astype("<i2", copy=False).tobytes()  # already PCM16 at the output rate: as it is
        return out + float_to_pcm16(samples)

    def flush(self) -> bytes:
        """The resampler's tail; call once at the end of the stream."""
        if self._resampler is None:
            return b""
        tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        self._resampler = None
        self._in_rate = None
        return float_to_pcm16(tail)


def wav_header(sample_rate: int, num_bytes: int | None = None) -> bytes:
    """A 44-byte PCM16 mono WAV header; ``num_bytes=None`` writes the 'unknown length' sizes for streaming."""
    data_size = _STREAMING_SIZE if num_bytes is None else num_bytes
    riff_size = _STREAMING_SIZE if num_bytes is None else 36 + num_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        1,  # mono
        sample_rate,
        sample_rate * 2,
        2,
        16,
        b"data",
        data_size,
    )


def encode_wav(pcm16: bytes, sample_rate: int) -> bytes:
    """A complete WAV file around PCM16 mono bytes."""
    return wav_header(sample_rate, len(pcm16)) + pcm16


def b64(data: bytes) -> str:
    """Base64 text, as OpenAI's JSON audio fields carry it."""
    return base64.b64encode(data).decode("ascii")


def audio_seconds(data: bytes) -> float | None:
    """The length of an uploaded file as its header states it, or None when it cannot be read."""
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        return None
    return info.frames / info.samplerate if info.samplerate > 0 else None


def decode_audio_file(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate from an uploaded file (WAV, FLAC, OGG/Vorbis/Opus, MP3…).

    Multi-channel audio is averaged to mono. Raises :class:`AudioFormatError` naming the problem.
    """
    import soundfile  # imported here: libsndfile is only needed when a file is uploaded

    if not data:
        raise AudioFormatError("the uploaded audio file is empty")
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as exc:
        why = exc.error_string.rstrip(".")
        raise AudioFormatError(f"could not decode the uploaded audio ({why}); send WAV, FLAC, OGG or MP3") from exc
    except (RuntimeError, TypeError, ValueError) as exc:
        raise AudioFormatError(f"could not decode the uploaded audio ({exc}); send WAV, FLAC, OGG or MP3") from exc
    return samples.mean(axis=1, dtype=np.float32), int(rate)
