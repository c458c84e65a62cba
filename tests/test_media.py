"""Chat media at the API edge (schedulers.media): audio parts become 16 kHz samples, image URLs pixels,
and every mistake names the part it is in."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from omnitrio.serve.audio import encode_wav
from schedulers.media import AUDIO_RATE, MAX_AUDIO_SECONDS, decode_audio, read_image_url, resample

WHERE = "messages[0].content[1].input_audio"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def tone(seconds: float, rate: int, hz: float = 330.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_raw_pcm16_is_openais_24_khz_resampled_to_16_khz() -> None:
    pcm = np.round(tone(1.0, 24_000) * 32767).astype("<i2")
    clip = decode_audio({"data": b64(pcm.tobytes()), "format": "pcm16"}, WHERE)
    assert clip.dtype == np.float32 and len(clip) == AUDIO_RATE
    np.testing.assert_allclose(clip, resample(pcm.astype(np.float32) / 32768.0, 24_000, AUDIO_RATE))


@pytest.mark.parametrize("rate", [8_000, 16_000, 44_100])
def test_a_wav_of_any_rate_arrives_at_16_khz(rate: int) -> None:
    pcm = np.round(tone(0.5, rate) * 32767).astype("<i2")
    clip = decode_audio({"data": b64(encode_wav(pcm.tobytes(), rate)), "format": "wav"}, WHERE)
    assert len(clip) == AUDIO_RATE // 2
    expected = resample(pcm.astype(np.float32) / 32768.0, rate, AUDIO_RATE)
    np.testing.assert_allclose(clip, expected)


def test_python_callers_may_pass_samples_and_their_rate() -> None:
    samples = tone(0.25, 48_000)
    clip = decode_audio({"array": samples, "sample_rate": 48_000}, WHERE)
    np.testing.assert_allclose(clip, resample(samples, 48_000, AUDIO_RATE))
    same = decode_audio({"array": tone(0.25, AUDIO_RATE)}, WHERE)
    np.testing.assert_array_equal(same, tone(0.25, AUDIO_RATE))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"data": "AAAA", "format": "mp3"}, f"{WHERE}.format: 'mp3' is not supported"),
        ({"data": "not base64!", "format": "wav"}, f"{WHERE}.data: invalid base64"),
        ({"data": b64(b"RIFF...."), "format": "wav"}, f"{WHERE}.data: not a readable WAV file"),
        ({"data": b64(b"\x00\x01\x02"), "format": "pcm16"}, f"{WHERE}.data: pcm16 needs an even number of bytes"),
        ({"array": np.zeros((2, 10), np.float32)}, f"{WHERE}.array: must be mono"),
        ({"array": np.zeros(10, np.float32), "sample_rate": 0}, f"{WHERE}.sample_rate: must be a positive integer"),
        ({"array": np.zeros(int(MAX_AUDIO_SECONDS + 1) * AUDIO_RATE, np.float32)}, f"{WHERE}: audio is 61.0 s long"),
    ],
)
def test_a_bad_audio_part_is_refused_naming_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        decode_audio(spec, WHERE)
    assert str(caught.value).startswith(message)


def png_data_url(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + b64(buffer.getvalue())


def test_a_png_data_url_gives_its_pixels_unresized() -> None:
    pytest.importorskip("PIL")
    pixels = np.arange(40 * 48 * 3, dtype=np.uint8).reshape(40, 48, 3)
    got = read_image_url(png_data_url(pixels), "messages[0].content[0].image_url.url")
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, pixels)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/cat.png", "only data: URLs are accepted"),
        ("data:image/png,notbase64", "the data URL must be base64-encoded"),
        ("data:image/png;base64," + b64(b"not an image"), "not a readable image"),
    ],
)
def test_an_image_url_that_is_not_an_inline_image_is_refused_naming_the_part(url: str, message: str) -> None:
    pytest.importorskip("PIL")
    where = "messages[0].content[0].image_url.url"
    with pytest.raises(ValueError) as caught:
        read_image_url(url, where)
    assert str(caught.value).startswith(f"{where}: {message}")
