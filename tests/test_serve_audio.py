"""PCM16 / WAV / resampling helpers at the API edge."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from omnitrio.serve.audio import (
    AudioFormatError,
    PcmStream,
    decode_audio_file,
    encode_wav,
    float_to_pcm16,
    pcm16_to_float,
    to_float32,
    wav_header,
)
from tests.fake_pipeline import tone


def test_chunked_resampling_matches_the_exact_output_length() -> None:
    stream = PcmStream(24_000)
    pcm = b"".join(stream.push({"pcm": tone(0.1, 16_000), "sample_rate": 16_000}) for _ in range(7)) + stream.flush()
    assert len(pcm) == 7 * 2400 * 2


def test_chunked_resampling_has_no_seams() -> None:
    stream = PcmStream(24_000)
    signal = tone(1.0, 16_000, as_float=True)
    pcm = b"".join(stream.push({"pcm": part, "sample_rate": 16_000}) for part in np.split(signal, 10))
    out = pcm16_to_float(pcm + stream.flush())
    expected = tone(1.0, 24_000, as_float=True)
    assert np.max(np.abs(out[100:-100] - expected[100:-100])) < 0.01


def test_stream_without_a_fixed_rate_keeps_the_pipeline_rate() -> None:
    stream = PcmStream()
    pcm = stream.push({"pcm": tone(0.1, 22_050), "sample_rate": 22_050})
    assert (stream.rate, len(pcm)) == (22_050, 2205 * 2)


def test_int16_audio_at_the_output_rate_reaches_the_client_sample_for_sample() -> None:
    samples = np.array([-32768, -32767, -1, 0, 1, 12345, 32767], dtype=np.int16)
    stream = PcmStream(24_000)
    pcm = stream.push({"pcm": samples, "sample_rate": 24_000}) + stream.flush()
    assert np.array_equal(np.frombuffer(pcm, dtype="<i2"), samples)


def test_a_streaming_wav_header_is_readable_by_wave() -> None:
    pcm = float_to_pcm16(tone(0.5, 16_000, as_float=True))
    with wave.open(io.BytesIO(wav_header(16_000) + pcm)) as wav:
        assert (wav.getframerate(), len(wav.readframes(1 << 20))) == (16_000, len(pcm))


def test_pcm16_round_trip_clips_instead_of_wrapping() -> None:
    assert pcm16_to_float(float_to_pcm16(np.array([2.0, -2.0], np.float32))).tolist() == pytest.approx(
        [1.0, -1.0], abs=1e-4
    )


def test_stereo_arrays_are_refused_with_their_shape() -> None:
    with pytest.raises(AudioFormatError, match=r"\(2, 100\)"):
        to_float32(np.zeros((2, 100), np.int16))


def test_a_wav_file_decodes_to_mono_float32() -> None:
    samples, rate = decode_audio_file(encode_wav(float_to_pcm16(tone(0.25, 8_000, as_float=True)), 8_000))
    assert (samples.dtype, samples.shape, rate) == (np.float32, (2000,), 8_000)
