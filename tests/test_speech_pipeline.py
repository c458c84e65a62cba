"""The default speech pipeline (configs/speech.toml) in one process: every task through one graph."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from omnitrio import CompleteMessage, Pipeline, RequestFailed, StreamMessage, open_pipeline
from omnitrio.cli import DEFAULT_CONFIG
from omnitrio.config_loading import load
from schedulers.speech.pipeline import task_of
from schedulers.speech.vad import EnergyScorer, VoiceActivityDetector
from toys.speech_text import heard_as

SENTENCE = "Turn left at the second traffic light."
# The "repeat" responder: answers these tests can predict word for word.
REPEAT = ("responder.factory.mode=repeat",)

pytestmark = pytest.mark.timeout(600)  # runs the speech models: past the global 120 s when busy


@asynccontextmanager
async def speech_pipeline() -> AsyncIterator[Pipeline]:
    pytest.importorskip("piper", reason="the speech extra is not installed")
    async with open_pipeline(load(DEFAULT_CONFIG, REPEAT), inline=True) as pipeline:
        yield pipeline


def spoken(text: str, rate: int = 16_000) -> np.ndarray:
    from schedulers.speech.audio import resample
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer("auto", threads=2)
    return resample(tts.synthesize(text), tts.sample_rate, rate)


def words(text: str) -> list[str]:
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()


async def collect(pipeline: Pipeline, rid: str, inputs: Any) -> tuple[list[StreamMessage], Any]:
    chunks = []
    async with pipeline.stream(rid, inputs) as messages:
        async for message in messages:
            if isinstance(message, StreamMessage):
                chunks.append(message)
    assert isinstance(message, CompleteMessage)
    return chunks, messages.result


def test_vad_reports_a_pause_then_either_resumed_or_stopped() -> None:
    loud = np.full(512 * 10, 0.3, np.float32)
    detector = VoiceActivityDetector(scorer=EnergyScorer(), silence_duration_ms=320, pause_ms=96)
    gap, long_gap = np.zeros(512 * 4, np.float32), np.zeros(512 * 12, np.float32)
    events = [e.type for e in detector.feed(np.concatenate([loud, gap, loud, long_gap]))]
    assert events == ["speech_started", "speech_paused", "speech_resumed", "speech_paused", "speech_stopped"]


def test_vad_without_pause_ms_reports_only_start_and_stop() -> None:
    detector = VoiceActivityDetector(scorer=EnergyScorer(), silence_duration_ms=320)
    clip = np.concatenate([np.full(5120, 0.3, np.float32), np.zeros(512 * 12, np.float32)])
    assert [e.type for e in detector.feed(clip)] == ["speech_started", "speech_stopped"]


@pytest.mark.slow
async def test_text_chat_is_answered_by_the_responder_alone() -> None:
    async with speech_pipeline() as pipeline:
        chunks, result = await collect(
            pipeline, "c", {"task": "chat", "messages": [{"role": "user", "content": "Hi."}]}
        )
    assert (chunks, result) == ([], {"text": "Hi."})


@pytest.mark.slow
async def test_speech_streams_24khz_audio_sentence_by_sentence() -> None:
    async with speech_pipeline() as pipeline:
        chunks, result = await collect(pipeline, "s", {"task": "speech", "input": "Hello there. See you soon."})
    audio = [c.chunk for c in chunks if c.modality == "audio"]
    assert len(audio) >= 2 and {a["sample_rate"] for a in audio} == {24_000}
    assert result["transcript"] == "Hello there. See you soon."
    assert sum(a["pcm"].size for a in audio) == result["num_samples"]


@pytest.mark.slow
async def test_chat_asking_for_audio_is_spoken() -> None:
    inputs = {"task": "chat", "messages": [{"role": "user", "content": SENTENCE}], "modalities": ["text", "audio"]}
    async with speech_pipeline() as pipeline:
        chunks, result = await collect(pipeline, "ca", inputs)
    assert any(c.modality == "audio" for c in chunks) and result["transcript"] == SENTENCE


@pytest.mark.slow
async def test_transcription_hears_piper_speech_resampled_from_22khz() -> None:
    async with speech_pipeline() as pipeline:
        result = await pipeline.submit("t", {"task": "transcription", "audio": spoken(SENTENCE)})
    assert heard_as(result["text"], SENTENCE)


def test_the_pipeline_takes_no_realtime_task_the_server_never_sends() -> None:
    # A realtime session sends transcription, chat and asr_session requests (omnitrio.serve).
    with pytest.raises(ValueError, match="inputs need 'task' set to one of"):
        task_of({"task": "realtime", "audio": np.zeros(16_000, np.float32)})


@pytest.mark.slow
async def test_streaming_asr_session_gives_partial_transcripts_while_audio_arrives() -> None:
    audio = spoken("The weather will be sunny and warm tomorrow. My phone battery is almost empty.", 24_000)
    pcm = (audio * 32767).astype("<i2").tobytes()
    partials: list[str] = []

    def command(op: str, **fields: Any) -> dict[str, Any]:
        return {"task": "asr_session", "command": {"op": op, "session_id": "s1", **fields}}

    async with speech_pipeline() as pipeline:
        await pipeline.submit("open", command("open", config={"sample_rate": 24_000, "partial_every_ms": 1000}))
        step = 2 * 24_000 // 2  # 0.5 s per append
        for i in range(0, len(pcm), step):
            chunks, _ = await collect(pipeline, f"append-{i}", command("append", chunk=pcm[i : i + step]))
            partials += [c.chunk for c in chunks if c.modality == "text"]
        final = await pipeline.submit("close", command("close"))
    assert len(partials) >= 2
    assert words("".join(partials)) == words(final["text"])[: len(words("".join(partials)))]
    assert words(final["text"])[:3] == ["the", "weather", "will"]


@pytest.mark.slow
async def test_a_request_without_a_known_task_fails_naming_the_field() -> None:
    async with speech_pipeline() as pipeline:
        with pytest.raises(RequestFailed, match="'task' set to one of"):
            await pipeline.submit("bad", {"task": "dance"})


def wav_part(samples: np.ndarray, rate: int = 16_000) -> dict[str, Any]:
    from omnitrio.serve.audio import b64, encode_wav, float_to_pcm16

    return {
        "type": "input_audio",
        "input_audio": {"data": b64(encode_wav(float_to_pcm16(samples), rate)), "format": "wav"},
    }


@pytest.mark.slow
async def test_chat_input_audio_is_transcribed_and_answered_like_text(nursery: Any) -> None:
    import openai
    import trio

    from tests.fake_pipeline import start_server

    messages = [{"role": "user", "content": [wav_part(spoken(SENTENCE, 22_050), 22_050)]}]

    def ask(url: str) -> tuple[Any, Any]:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            text = client.chat.completions.create(model="omnitrio-speech", messages=messages)
            spoken_answer = client.chat.completions.create(
                model="omnitrio-speech",
                messages=messages,
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "wav"},
            )
            return text, spoken_answer

    async with speech_pipeline() as pipeline:
        served = await start_server(nursery, pipeline)  # type: ignore[arg-type]
        text, spoken_answer = await trio.to_thread.run_sync(ask, served.url)
    assert heard_as(text.choices[0].message.content, SENTENCE)  # the repeat responder says what it heard
    audio = spoken_answer.choices[0].message.audio
    assert heard_as(audio.transcript, SENTENCE) and len(audio.data) > 10_000


@pytest.mark.slow
async def test_verbose_json_names_the_language_heard_as_openai_does(nursery: Any) -> None:
    import openai
    import trio

    from omnitrio.serve.audio import encode_wav, float_to_pcm16
    from tests.fake_pipeline import start_server

    clip = encode_wav(float_to_pcm16(spoken(SENTENCE)), 16_000)

    def transcribe(url: str) -> Any:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            return client.audio.transcriptions.create(
                model="whisper-1", file=("turn.wav", clip), response_format="verbose_json"
            )

    async with speech_pipeline() as pipeline:
        served = await start_server(nursery, pipeline)  # type: ignore[arg-type]
        verbose = await trio.to_thread.run_sync(transcribe, served.url)
    assert verbose.language == "english"  # Whisper tiny.en: English only, by OpenAI's name
    assert heard_as(verbose.text, SENTENCE) and verbose.segments and verbose.segments[0].end > 1.0
