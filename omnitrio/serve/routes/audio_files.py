"""Compressed speech files: PCM16 mono encoded as ``mp3``, ``opus``, ``aac`` or ``flac`` by FFmpeg (PyAV).

:func:`encode_audio` takes a whole answer's PCM16 and returns one complete file: MP3 (LAME), Ogg Opus,
AAC in ADTS, or FLAC, at the audio's own rate (Opus at 24 kHz, a rate it codes, resampled by FFmpeg).
It blocks for a while on a long answer: call it off the trio thread. PyAV comes with the ``speech``
extra (it is faster-whisper's decoder too); without it, asking for these formats is a 400 saying what
to install (:func:`require_encoder`), before the pipeline sees the request.
"""

from __future__ import annotations

import importlib.util
import io
from typing import Final

import attrs
import numpy as np

from omnitrio.serve.api_errors import invalid_value

OPUS_RATE: Final = 24_000


@attrs.frozen
class _Format:
    container: str
    codec: str
    media_type: str
    rate: int | None = None  # None: the audio's own


ENCODED: Final = {
    "mp3": _Format("mp3", "libmp3lame", "audio/mpeg"),
    "opus": _Format("ogg", "libopus", "audio/ogg", OPUS_RATE),
    "aac": _Format("adts", "aac", "audio/aac"),
    "flac": _Format("flac", "flac", "audio/flac"),
}


def require_encoder(response_format: str) -> None:
    """400 naming ``response_format`` when PyAV, which encodes it, is not installed."""
    if response_format in ENCODED and importlib.util.find_spec("av") is None:
        raise invalid_value(
            f"response_format {response_format!r} needs PyAV, which is not installed on this server "
            "(pip install 'omnitrio[speech]'); 'wav' and 'pcm' need nothing",
            "response_format",
        )


def encode_audio(pcm16: bytes, rate: int, response_format: str) -> bytes:
    """One complete ``response_format`` file (a key of :data:`ENCODED`) of PCM16 mono at ``rate``."""
    import av

    spec = ENCODED[response_format]
    out_rate = spec.rate or rate
    out = io.BytesIO()
    with av.open(out, "w", format=spec.container) as container:
        stream = container.add_stream(spec.codec, rate=out_rate, layout="mono")
        assert isinstance(stream, av.AudioStream)
        codec = stream.codec_context
        resampler = av.AudioResampler(
            format=codec.format.name, layout="mono", rate=out_rate, frame_size=codec.frame_size or None
        )
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16, "<i2").reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            container.mux(stream.encode(piece))
        container.mux(stream.encode(None))
    return out.getvalue()
