"""Audio at the API edge: mono float32 inside, PCM16 outside, and sample-rate conversion.

The pipeline speaks three rates: 16 kHz (ASR and VAD input), 22.05 kHz (the Piper voice) and
24 kHz (OpenAI's PCM16 output and realtime audio).  :func:`resample` converts a whole clip;
:class:`StreamResampler` converts a clip that arrives in pieces without clicks at the seams.
Both use libsoxr (``soxr``) when it is installed and fall back to SciPy's polyphase filter.
Outputs are always new float32 arrays: callers may keep or mutate them.
"""

from __future__ import annotations

from math import gcd
from typing import Any

import numpy as np
import numpy.typing as npt

FloatAudio = npt.NDArray[np.float32]
Pcm16 = npt.NDArray[np.int16]

ASR_SAMPLE_RATE = 16_000
API_SAMPLE_RATE = 24_000


def as_float_audio(audio: Any, *, name: str = "audio") -> FloatAudio:
    """Return ``audio`` as a 1-D float32 array in [-1, 1]; PCM16 (array or bytes) is scaled.

    Raises ``ValueError`` naming ``name`` when the input is not mono audio.
    """
    if isinstance(audio, bytes | bytearray | memoryview):
        if len(audio) % 2:
            raise ValueError(f"{name}: PCM16 bytes must have an even length, got {len(audio)}")
        return pcm16_to_float(np.frombuffer(audio, dtype="<i2"))
    array = np.asarray(audio)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected mono audio (a 1-D array), got shape {array.shape}")
    match array.dtype.kind:
        case "i" if array.dtype == np.int16:
            return pcm16_to_float(array)
        case "f":
            return array.astype(np.float32, copy=True)
        case _:
            raise ValueError(f"{name}: expected float32 samples or int16 PCM, got dtype {array.dtype}")


def float_to_pcm16(audio: npt.ArrayLike) -> Pcm16:
    """Clip to [-1, 1] and scale to int16 (the wire format of the OpenAI audio APIs)."""
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return np.round(samples * 32767.0).astype(np.int16)


def pcm16_to_float(pcm: npt.ArrayLike) -> FloatAudio:
    """Scale int16 PCM to float32 in [-1, 1)."""
    return (np.asarray(pcm, dtype=np.int16).astype(np.float32) / 32768.0).astype(np.float32)


def _check_rate(rate: int, name: str) -> None:
    if not isinstance(rate, int) or rate <= 0:
        raise ValueError(f"{name} must be a positive integer sample rate, got {rate!r}")


def resample(audio: npt.ArrayLike, from_rate: int, to_rate: int) -> FloatAudio:
    """Convert a whole mono clip from ``from_rate`` to ``to_rate`` Hz (band-limited, no aliasing).

    The output has ``round(len(audio) * to_rate / from_rate)`` samples (±1 for SciPy).
    """
    _check_rate(from_rate, "from_rate")
    _check_rate(to_rate, "to_rate")
    samples = as_float_audio(audio)
    if from_rate == to_rate or samples.size == 0:
        return samples
    try:
        import soxr
    except ImportError:
        from scipy.signal import resample_poly

        divisor = gcd(from_rate, to_rate)
        out = resample_poly(samples, to_rate // divisor, from_rate // divisor)
        return np.asarray(out, dtype=np.float32)
    return np.asarray(soxr.resample(samples, from_rate, to_rate, quality="HQ"), dtype=np.float32)


class StreamResampler:
    """Resample a stream chunk by chunk; the concatenated output matches resampling the whole.

    With ``soxr`` the filter state carries across chunks (output lags input by the filter
    delay until :meth:`flush`).  Without it each chunk is resampled on its own, which is
    exact only at chunk boundaries that fall on silence (true of Piper's sentence chunks).
    One instance belongs to one stream and one thread.
    """

    def __init__(self, from_rate: int, to_rate: int) -> None:
        _check_rate(from_rate, "from_rate")
        _check_rate(to_rate, "to_rate")
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream: Any = None
        if from_rate != to_rate:
            try:
                import soxr
            except ImportError:
                return
            self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality="HQ")

    def push(self, chunk: npt.ArrayLike) -> FloatAudio:
        """Resample the next chunk; may return fewer samples than expected until :meth:`flush`."""
        samples = as_float_audio(chunk, name="chunk")
        if self._stream is None:
            return resample(samples, self.from_rate, self.to_rate)
        return np.asarray(self._stream.resample_chunk(samples, last=False), dtype=np.float32)

    def flush(self) -> FloatAudio:
        """Return the samples still held in the filter; the stream is finished afterwards."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        return np.asarray(self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True), dtype=np.float32)
