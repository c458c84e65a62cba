"""configs/qwen2.5-omni.toml's spoken answers over HTTP (the official ``openai`` client) against transformers'.

A streamed spoken answer (``delta.audio``) is as long as ``generate``'s whole decode and within the streaming
scheme's distance of it, in several chunks, and a long answer's first audio comes while its text is still
streaming; a whole one equals
``generate``'s for text, audio and image prompts; the seed and the voice each change the audio (the text
stays), the input audio's content changes the text, each as ``generate`` answers it.
"""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import numpy as np
import pytest

from schedulers.qwen2_5_omni.front.preprocess import SYSTEM_PROMPT
from tests import qwen2_5_omni_reference as ref
from tests.qwen2_5_omni_reference import reference_model, tiny_checkpoint, tiny_processor  # noqa: F401  (fixtures)
from tests.test_qwen2_5_omni_thinker_stage import PROMPTS, call, chat, served_url  # noqa: F401  (fixture url)
from toys.qwen3_omni_requests import pcm16, snr_db

pytestmark = pytest.mark.timeout(600)

LONG = 40  # answer tokens: enough for several streamed audio chunks
VERY_LONG = 240  # answer tokens: text that takes far longer to stream than the first audio takes to come
MIN_STREAMED_SNR_DB = 70.0  # the stage reaches 80-97 dB on the tiny checkpoint; a window without look-ahead ~48
MIN_WHOLE_SNR_DB = 60.0


def reference(model: Any, processor: Any, parts: list[dict[str, Any]], **knobs: Any) -> ref.Answer:
    """``generate``'s greedy spoken answer to the user ``parts`` under the model's system prompt."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": parts}]
    return ref.reference_answer(model, processor, messages, **knobs)


def spoken(name: str, *, voice: str = "Chelsie", seed: int = 0, tokens: int = 10, **fields: Any) -> dict[str, Any]:
    audio = {"voice": voice, "format": "pcm16" if fields.get("stream") else "wav"}
    body = chat(name, temperature=0, seed=seed, modalities=["text", "audio"], audio=audio, **fields)
    return {**body, "max_tokens": tokens}


async def whole_speech(url: str, body: dict[str, Any]) -> tuple[str, np.ndarray]:
    """A non-streamed spoken answer: its transcript and WAV samples (24 kHz mono PCM16)."""
    completion = await call(url, lambda c: c.chat.completions.create(**body))
    audio = completion.choices[0].message.audio
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as got:
        assert (got.getframerate(), got.getnchannels(), got.getsampwidth()) == (24_000, 1, 2)
        return audio.transcript, np.frombuffer(got.readframes(got.getnframes()), "<i2")


def assert_equal_audio(expected: ref.Answer, samples: np.ndarray, floor: float) -> None:
    want = pcm16(expected.wav.reshape(-1).numpy())
    assert len(samples) == len(want)
    assert snr_db(want, samples) >= floor


def transcript_of(answer: ref.Answer, processor: Any) -> str:
    return str(processor.tokenizer.decode(answer.ids, skip_special_tokens=True))


async def streamed_events(url: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """A streamed answer's ``("audio", base64 pcm)``, ``("text", piece)`` and ``("finish", reason)`` events, in
    the order the SSE stream carried them."""
    chunks = await call(url, lambda c: list(c.chat.completions.create(**body)))
    events = []
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        audio = choice.delta.audio.model_dump() if choice.delta.audio else {}
        if audio.get("data"):
            events.append(("audio", audio["data"]))
        if audio.get("transcript") or choice.delta.content:
            events.append(("text", audio.get("transcript") or choice.delta.content))
        if choice.finish_reason:
            events.append(("finish", choice.finish_reason))
    return events


async def test_a_streamed_spoken_answer_follows_the_whole_decode_in_chunks(
    url: str, model: Any, processor: Any
) -> None:
    expected = reference(model, processor, PROMPTS["text"][1], seed=5, max_new_tokens=LONG)
    assert len(expected.ids) == LONG  # the answer runs to max_tokens: its text is long
    body = spoken("text", seed=5, tokens=LONG, stream=True)
    events = await streamed_events(url, body)
    kinds = [kind for kind, _ in events]
    assert "".join(p for k, p in events if k == "text") == transcript_of(expected, processor)
    assert kinds.count("audio") > 1 and kinds[-1] == "finish"  # the speech streams in chunks, then the end
    pcm = np.frombuffer(b"".join(base64.b64decode(p) for k, p in events if k == "audio"), "<i2")
    assert_equal_audio(expected, pcm, MIN_STREAMED_SNR_DB)


async def test_the_first_audio_leaves_while_the_answers_text_is_still_coming(url: str) -> None:
    """The talker speaks each token as the thinker makes it and token2wav decodes its first chunk as soon as
    the codes reach past it: over HTTP, audio is heard long before a long answer's text is complete."""
    events = await streamed_events(url, spoken("text", seed=5, tokens=VERY_LONG, stream=True))
    first_audio = [kind for kind, _ in events].index("audio")
    before = "".join(piece for kind, piece in events[:first_audio] if kind == "text")
    after = "".join(piece for kind, piece in events[first_audio:] if kind == "text")
    assert events[-1] == ("finish", "length")  # the answer ran to max_tokens: a long text
    assert after, f"the whole transcript ({len(before)} characters) came before the first audio"


@pytest.mark.parametrize("name", list(PROMPTS))
async def test_a_whole_spoken_answer_is_generates(url: str, model: Any, processor: Any, name: str) -> None:
    expected = reference(model, processor, PROMPTS[name][1], seed=2, max_new_tokens=10)
    transcript, samples = await whole_speech(url, spoken(name, seed=2))
    assert transcript == transcript_of(expected, processor)
    assert_equal_audio(expected, samples, MIN_WHOLE_SNR_DB)


async def test_the_seed_and_the_voice_change_the_audio_as_they_change_generates(
    url: str, model: Any, processor: Any
) -> None:
    answers = {}
    for voice, seed in (("Chelsie", 1), ("Chelsie", 2), ("Ethan", 1)):
        expected = reference(model, processor, PROMPTS["text"][1], speaker=voice, seed=seed, max_new_tokens=10)
        transcript, samples = await whole_speech(url, spoken("text", voice=voice, seed=seed))
        assert transcript == transcript_of(expected, processor)
        assert_equal_audio(expected, samples, MIN_WHOLE_SNR_DB)
        answers[voice, seed] = (expected.ids, pcm16(expected.wav.reshape(-1).numpy()))
    chelsie, reseeded, ethan = answers.values()
    assert chelsie[0] == reseeded[0] and snr_db(chelsie[1], reseeded[1]) < 20  # the seed: same text, new noise
    assert chelsie[0] == ethan[0] and (len(chelsie[1]) != len(ethan[1]) or snr_db(chelsie[1], ethan[1]) < 20)


async def test_the_input_audios_content_changes_the_answer_as_it_changes_generates(
    url: str, model: Any, processor: Any
) -> None:
    texts = []
    for frequency in (440, 880):
        sound = ref.clip(frequency, 1.2)
        parts = [
            {"type": "input_audio", "input_audio": {"data": ref.wav(sound), "format": "wav"}},
            {"type": "text", "text": "Hm?"},
        ]
        expected = reference(model, processor, [{"type": "audio", "audio": ref.pcm16(sound)}, ref.text("Hm?")])
        body = spoken("text", seed=0, tokens=8)
        body["messages"] = [{"role": "user", "content": parts}]
        transcript, samples = await whole_speech(url, body)
        assert transcript == transcript_of(expected, processor)
        assert_equal_audio(expected, samples, MIN_WHOLE_SNR_DB)
        texts.append(expected.ids)
    assert texts[0] != texts[1]
