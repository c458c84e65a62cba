"""Telephony audio: G.711 µ-law (``audio/pcmu``) and A-law (``audio/pcma``) at 8 kHz.

Phone gateways speak G.711: one byte per sample, 8000 samples a second.  The realtime session
speaks PCM16 at 24 kHz, so a telephony client's audio is decoded and upsampled on the way in
(:class:`TelephonyDecoder`) and downsampled and encoded on the way out (:class:`TelephonyEncoder`).
Both resample with a *stateful* soxr stream, so chunk boundaries add no clicks; :meth:`flush`
returns what the filter still holds at the end of a stream.  One instance serves one stream.

The codecs are the ITU-T G.711 tables as Sun's reference ``g711.c`` computes them (the code
CPython's ``audioop`` used): :func:`encode` and :func:`decode` are exact table look-ups, so
``decode(encode(decode(codes))) == decode(codes)`` for every code.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import soxr

from omnitrio.serve.audio import REALTIME_RATE, AudioFormatError, float_to_pcm16, pcm16_to_float

G711Law = Literal["pcmu", "pcma"]
TELEPHONY_RATE = 8_000
_ALL_PCM16 = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32)  # indexed by the uint16 view
_ALL_CODES = np.arange(256, dtype=np.int32)


def _bit_length(values: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Python's ``int.bit_length`` for non-negative int32 values."""
    return np.frexp(values.astype(np.float64))[1].astype(np.int32)


def _ulaw_encode_all() -> npt.NDArray[np.uint8]:
    shifted = _ALL_PCM16 >> 2  # 14-bit, arithmetic shift as in g711.c
    mask = np.where(shifted < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(shifted), 8159) + 0x21
    segment = np.maximum(_bit_length(magnitude) - 6, 0)
    code = (segment << 4) | ((magnitude >> (segment + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode_all() -> npt.NDArray[np.int16]:
    inverted = ~_ALL_CODES & 0xFF
    magnitude = (((inverted & 0x0F) << 3) + 0x84) << ((inverted & 0x70) >> 4)
    return np.where(inverted & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


def _alaw_encode_all() -> npt.NDArray[np.uint8]:
    shifted = _ALL_PCM16 >> 3  # 13-bit
    mask = np.where(shifted >= 0, 0xD5, 0x55)
    magnitude = np.where(shifted >= 0, shifted, -shifted - 1)
    segment = np.maximum(_bit_length(magnitude) - 5, 0)
    quantised = (magnitude >> np.maximum(segment, 1)) & 0x0F
    code = np.where(segment >= 8, 0x7F, (segment << 4) | quantised)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode_all() -> npt.NDArray[np.int16]:
    toggled = _ALL_CODES ^ 0x55
    segment = (toggled & 0x70) >> 4
    base = ((toggled & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = base << np.maximum(segment - 1, 0)
    return np.where(toggled & 0x80, magnitude, -magnitude).astype(np.int16)


def _frozen(table: npt.NDArray[Any]) -> npt.NDArray[Any]:
    table.flags.writeable = False
    return table


_ULAW_ENCODE, _ULAW_DECODE = _frozen(_ulaw_encode_all()), _frozen(_ulaw_decode_all())
_ALAW_ENCODE, _ALAW_DECODE = _frozen(_alaw_encode_all()), _frozen(_alaw_decode_all())


def g711_law(format_type: Any) -> G711Law:
    """The law of a realtime audio format: ``audio/pcmu`` (or the beta ``g711_ulaw``) or
    ``audio/pcma`` (``g711_alaw``); any other name is an :class:`AudioFormatError` naming it."""
    match format_type:
        case "audio/pcmu" | "g711_ulaw" | "pcmu":
            return "pcmu"
        case "audio/pcma" | "g711_alaw" | "pcma":
            return "pcma"
        case _:
            raise AudioFormatError(f"not a G.711 audio format: {format_type!r} (expected audio/pcmu or audio/pcma)")


def encode(pcm16: npt.ArrayLike, law: G711Law) -> bytes:
    """G.711 bytes for int16 samples (any rate: the codec is memoryless)."""
    samples = np.asarray(pcm16)
    if samples.dtype != np.int16:
        raise AudioFormatError(f"G.711 encodes int16 samples, got {samples.dtype}")
    table = _ULAW_ENCODE if g711_law(law) == "pcmu" else _ALAW_ENCODE
    return table[samples.reshape(-1).view(np.uint16)].tobytes()


def decode(data: bytes, law: G711Law) -> npt.NDArray[np.int16]:
    """Int16 samples for G.711 bytes (one sample per byte); the array is new and writable."""
    codes = np.frombuffer(data, dtype=np.uint8)
    table = _ULAW_DECODE if g711_law(law) == "pcmu" else _ALAW_DECODE
    return table[codes]


class TelephonyDecoder:
    """G.711 bytes at 8 kHz in, little-endian PCM16 bytes at 24 kHz (the session's rate) out."""

    def __init__(self, law: G711Law, out_rate: int = REALTIME_RATE) -> None:
        self.law = g711_law(law)
        self._resampler = soxr.ResampleStream(TELEPHONY_RATE, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, data: bytes) -> bytes:
        """PCM16 for the next chunk (a little shorter than 3x while the filter fills)."""
        samples = decode(data, self.law).astype(np.float32) / 32768.0
        return float_to_pcm16(self._resampler.resample_chunk(samples, last=False))

    def flush(self) -> bytes:
        """The PCM16 still held in the filter; the stream is finished afterwards."""
        return float_to_pcm16(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))


class TelephonyEncoder:
    """Little-endian PCM16 bytes at 24 kHz in, G.711 bytes at 8 kHz out."""

    def __init__(self, law: G711Law, in_rate: int = REALTIME_RATE) -> None:
        self.law = g711_law(law)
        self._resampler = soxr.ResampleStream(in_rate, TELEPHONY_RATE, 1, dtype="float32", quality="HQ")

    def push(self, pcm16: bytes) -> bytes:
        """G.711 for the next chunk of PCM16 (an odd byte count is an :class:`AudioFormatError`)."""
        return self._encode(self._resampler.resample_chunk(pcm16_to_float(pcm16), last=False))

    def flush(self) -> bytes:
        """The G.711 bytes still held in the filter; the stream is finished afterwards."""
        return self._encode(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))

    def _encode(self, samples: npt.NDArray[np.float32]) -> bytes:
        pcm = np.frombuffer(float_to_pcm16(samples), dtype="<i2").astype(np.int16)
        return encode(pcm, self.law)
