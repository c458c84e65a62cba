"""Resampling between 16, 22.05 and 24 kHz and PCM16 conversion at the API edge."""

from __future__ import annotations

import numpy as np
import pytest

from schedulers.speech.audio import StreamResampler, as_float_audio, float_to_pcm16, pcm16_to_float, resample

RATES = [16_000, 22_050, 24_000]


def sine(frequency: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def dominant_frequency(audio: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(audio.size)))
    return float(np.fft.rfftfreq(audio.size, 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("source", RATES)
@pytest.mark.parametrize("target", RATES)
def test_resampling_keeps_a_440_hz_tone_at_440_hz(source: int, target: int) -> None:
    out = resample(sine(440.0, source), source, target)
    assert out.dtype == np.float32
    assert abs(out.size - target) <= 1
    assert dominant_frequency(out, target) == pytest.approx(440.0, abs=2.0)


def test_resampling_round_trip_preserves_the_waveform() -> None:
    tone = sine(440.0, 24_000)
    back = resample(resample(tone, 24_000, 22_050), 22_050, 24_000)
    core = slice(1000, -1000)  # ignore filter edges
    assert np.max(np.abs(back[core] - tone[core])) < 0.01


def test_stream_resampler_matches_whole_clip_resampling() -> None:
    tone = sine(440.0, 22_050)
    stream = StreamResampler(22_050, 24_000)
    pieces = [stream.push(tone[start : start + 3000]) for start in range(0, tone.size, 3000)]
    streamed = np.concatenate([*pieces, stream.flush()])
    assert abs(streamed.size - 24_000) <= 1
    whole = resample(tone, 22_050, 24_000)
    core = slice(1000, 23_000)
    assert np.max(np.abs(streamed[core] - whole[core])) < 0.01


def test_pcm16_round_trip_is_within_one_step() -> None:
    audio = np.linspace(-1.0, 1.0, 1001, dtype=np.float32)
    pcm = float_to_pcm16(audio)
    assert pcm.dtype == np.int16 and pcm.min() == -32767 and pcm.max() == 32767
    assert np.max(np.abs(pcm16_to_float(pcm) - audio)) < 2 / 32768


def test_float_to_pcm16_clips_instead_of_wrapping() -> None:
    assert float_to_pcm16(np.array([2.0, -2.0], dtype=np.float32)).tolist() == [32767, -32767]


def test_pcm16_bytes_are_accepted_as_audio() -> None:
    pcm = np.array([0, 16384, -16384], dtype="<i2")
    assert as_float_audio(pcm.tobytes()).tolist() == [0.0, 0.5, -0.5]


def test_stereo_audio_is_rejected_with_its_shape() -> None:
    with pytest.raises(ValueError, match=r"mono audio.*\(2, 10\)"):
        as_float_audio(np.zeros((2, 10), dtype=np.float32))


def test_bad_sample_rate_is_rejected() -> None:
    with pytest.raises(ValueError, match="to_rate"):
        resample(np.zeros(10, dtype=np.float32), 16_000, 0)
