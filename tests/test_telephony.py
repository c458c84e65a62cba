"""G.711 µ-law / A-law for phone gateways (``audio/pcmu``, ``audio/pcma``) and the 8 kHz ⇄ 24 kHz edge."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from omnitrio.serve.audio import AudioFormatError
from omnitrio.serve.realtime.g711 import TelephonyDecoder, TelephonyEncoder, decode, encode, g711_law

ALL_PCM16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_known_code_values() -> None:
    silence = np.zeros(1, dtype=np.int16)
    assert encode(silence, "pcmu") == b"\xff"
    assert encode(silence, "pcma") == b"\xd5"
    assert decode(b"\xff\x7f\x80\x00", "pcmu").tolist() == [0, 0, 32124, -32124]
    assert decode(b"\xd5\x55\xaa\x2a", "pcma").tolist() == [8, -8, 32256, -32256]
    loudest = np.array([32767, -32768], dtype=np.int16)
    assert encode(loudest, "pcmu") == b"\x80\x00"
    assert encode(loudest, "pcma") == b"\xaa\x2a"


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_codes_survive_a_round_trip(law: str) -> None:
    once = decode(ALL_CODES, law)
    assert np.array_equal(decode(encode(once, law), law), once)


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_every_sample_decodes_within_half_a_step(law: str) -> None:
    error = np.abs(decode(encode(ALL_PCM16, law), law).astype(np.int32) - ALL_PCM16.astype(np.int32))
    magnitude = np.abs(ALL_PCM16.astype(np.int32))
    in_range = magnitude <= 32000  # the codes' largest values are 32124 (µ-law) and 32256 (A-law)
    # 4 mantissa bits: half a step is at most 1/16 of the value (and 16 near zero)
    assert np.all(error[in_range] <= np.maximum(magnitude[in_range] / 16, 16))
    assert error.max() <= 1024


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_matches_cpythons_audioop_where_it_still_exists(law: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop", reason="audioop was removed in Python 3.13")
    to_code, to_linear = (audioop.lin2ulaw, audioop.ulaw2lin) if law == "pcmu" else (audioop.lin2alaw, audioop.alaw2lin)
    assert encode(ALL_PCM16, law) == to_code(ALL_PCM16.tobytes(), 2)
    assert decode(ALL_CODES, law).tobytes() == to_linear(ALL_CODES, 2)


def sine_24k(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (0.5 * np.sin(2 * np.pi * hz * t) * 32767).astype(np.int16)


@pytest.mark.parametrize("law", ["audio/pcmu", "audio/pcma"])
def test_session_audio_crosses_a_phone_line_in_chunks(law: str) -> None:
    tone = sine_24k(1.0)
    encoder, decoder = TelephonyEncoder(g711_law(law)), TelephonyDecoder(g711_law(law))
    chunks = np.array_split(tone, 7)  # odd sizes: the resamplers keep state across chunks
    line = b"".join(encoder.push(chunk.tobytes()) for chunk in chunks) + encoder.flush()
    assert len(line) == tone.size // 3  # 8 kHz, one byte a sample
    heard = np.frombuffer(
        b"".join(decoder.push(line[i : i + 160]) for i in range(0, len(line), 160)) + decoder.flush(), dtype="<i2"
    )
    assert heard.size == tone.size
    middle = slice(2400, -2400)  # the filters' edges
    noise = heard[middle].astype(np.float64) - tone[middle]
    snr_db = 10 * np.log10(np.mean(tone[middle].astype(np.float64) ** 2) / np.mean(noise**2))
    assert snr_db > 30


def test_bad_input_names_what_is_wrong() -> None:
    with pytest.raises(AudioFormatError, match="audio/pcm16"):
        g711_law("audio/pcm16")
    with pytest.raises(AudioFormatError, match="even number of bytes"):
        TelephonyEncoder("pcmu").push(b"\x00\x01\x02")
    with pytest.raises(AudioFormatError, match="int16"):
        encode(np.zeros(4, dtype=np.float32), "pcma")
