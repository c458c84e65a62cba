"""Qwen2.5-Omni's chat API over HTTP on the tiny checkpoint (configs/qwen2.5-omni.toml, talker greedy), as for
Qwen3-Omni: the voice is one of the checkpoint's speakers or an OpenAI name (→ the default, Chelsie), any
other a 400 listing the speakers; a video part is a 400; ``stream: true`` streams ``delta.audio`` chunks and
the transcript.  The answers themselves are checked against ``generate`` in test_qwen2_5_omni_thinker_stage
(including that a request without a system message is answered under the checkpoint's).
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests.qwen2_5_omni_reference import tiny_checkpoint  # noqa: F401  (fixture tiny)
from tests.test_qwen2_5_omni_thinker_stage import call, chat, config_of, serving

SPEAKERS = ("Chelsie", "Ethan")
LONG = 48  # answer tokens: speech of several token2wav chunks


@pytest.fixture
async def url(tiny: Path) -> AsyncIterator[str]:
    async for address in serving(config_of(tiny)):
        yield address


def spoken(**fields: Any) -> dict[str, Any]:
    return chat("text", temperature=0, seed=3, modalities=["text", "audio"], **fields)


def wav_samples(data: str) -> np.ndarray:
    with wave.open(io.BytesIO(base64.b64decode(data))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


async def answer(url: str, voice: str, **fields: Any) -> Any:
    body = spoken(audio={"voice": voice, "format": "wav"}, **fields)
    return (await call(url, lambda c: c.chat.completions.create(**body))).choices[0].message.audio


async def test_an_unknown_voice_is_a_400_listing_the_speakers(url: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await call(url, lambda c: c.chat.completions.create(**spoken(audio={"voice": "robot", "format": "wav"})))
    assert "'robot'" in caught.value.message and all(name in caught.value.message for name in SPEAKERS)


async def test_an_openai_voice_speaks_as_the_default_speaker(url: str) -> None:
    chelsie, alloy, ethan = [await answer(url, voice) for voice in ("Chelsie", "alloy", "Ethan")]
    assert chelsie.transcript == alloy.transcript == ethan.transcript
    assert np.array_equal(wav_samples(alloy.data), wav_samples(chelsie.data))
    assert not np.array_equal(wav_samples(ethan.data), wav_samples(chelsie.data))  # the voice matters


async def test_a_video_part_is_a_400(url: str) -> None:
    video = {"type": "input_video", "input_video": {"data": "AAAA", "format": "mp4"}}
    body = {**chat("text"), "messages": [{"role": "user", "content": [video, {"type": "text", "text": "What?"}]}]}
    with pytest.raises(openai.BadRequestError) as caught:
        await call(url, lambda c: c.chat.completions.create(**body))
    assert "video" in caught.value.message


async def test_a_streamed_answer_streams_audio_chunks_and_the_transcript(url: str) -> None:
    whole = await answer(url, "Chelsie", max_tokens=LONG)
    body = spoken(stream=True, audio={"voice": "Chelsie", "format": "pcm16"}, max_tokens=LONG)
    chunks = await call(url, lambda c: list(c.chat.completions.create(**body)))
    audio = [chunk.choices[0].delta.audio for chunk in chunks if chunk.choices and chunk.choices[0].delta.audio]
    parts = [a.model_dump() for a in audio]  # the SDK's ChoiceDeltaAudio keeps the extra fields
    pcm = b"".join(base64.b64decode(a["data"]) for a in parts if a.get("data"))
    assert "".join(a.get("transcript") or "" for a in parts) == whole.transcript
    assert sum(1 for a in parts if a.get("data")) > 1  # the speech streams in several chunks
    assert len(pcm) // 2 == len(wav_samples(whole.data))
