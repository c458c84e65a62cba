"""The realtime voice loop on the default pipeline: speech in, the transcript spoken back, barge-in, limits."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio
import trio_websocket

from omnitrio import open_pipeline
from omnitrio.cli import DEFAULT_CONFIG
from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.config_loading import load
from omnitrio.serve import serve
from tests.pipelines import settled_server
from tests.test_speech_pipeline import REPEAT
from toys.speech_text import heard_as

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # serves the speech pipeline
SENTENCE = "Turn left at the second traffic light."
LONG = "The train to Boston leaves from platform seven. The library closes at nine. We need chairs for the room."
# Long enough that its spoken reply is still streaming when the barge-in is heard.
LONGER = f"{LONG} Bring your own lunch on Friday. The meeting moves to room four. Call me when you land. Bye."
RATE = 24_000


@asynccontextmanager
async def realtime_url(overrides: Sequence[str] = ()) -> AsyncIterator[str]:
    """A server on a free port in front of the default pipeline (stages in this process)."""
    pytest.importorskip("piper", reason="the speech extra is not installed")
    async with open_pipeline(load(DEFAULT_CONFIG, [*REPEAT, *overrides]), inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve, pipeline, port=0, handle_signals=False, graceful_timeout=0.5))
            yield f"ws://127.0.0.1:{port}/v1/realtime"
            nursery.cancel_scope.cancel()


def pcm16(text: str, silence_after: float = 0.0, *, variation: float = 1.0) -> bytes:
    """``text`` said by the default voice at 24 kHz, 0.2 s of silence before it; ``variation`` 0.0
    gives the same samples on every run (see :class:`~schedulers.speech.tts.PiperSynthesizer`)."""
    from schedulers.speech.audio import float_to_pcm16, resample
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer("auto", threads=2, variation=variation)
    audio = resample(tts.synthesize(text), tts.sample_rate, RATE)
    padded = np.concatenate([np.zeros(RATE // 5, np.float32), audio, np.zeros(int(silence_after * RATE), np.float32)])
    return float_to_pcm16(padded).tobytes()


async def send_audio(rt: RealtimeClient, pcm: bytes, chunk_ms: int = 100) -> None:
    step = 2 * RATE * chunk_ms // 1000
    for i in range(0, len(pcm), step):
        await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step]).decode()})


def heard(events: list[dict[str, Any]]) -> str:
    """What Whisper hears in the response audio of ``events``."""
    from schedulers.speech.asr import shared_recognizer
    from schedulers.speech.audio import resample

    pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    audio = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    recognizer = shared_recognizer("auto", compute_type="int8", cpu_threads=2, beam_size=1)
    return recognizer.transcribe(resample(audio, RATE, 16_000))


def transcript(events: list[dict[str, Any]]) -> str:
    """The reply's transcript: with the "repeat" responder, what the turn was heard as."""
    return " ".join(e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done")


def assert_spoken_back(events: list[dict[str, Any]], sentence: str) -> None:
    """The turn was heard as ``sentence`` and the reply's audio says what was heard (each up to one word in five)."""
    turn = transcript(events)
    assert heard_as(turn, sentence), f"the turn was transcribed as {turn!r}"
    said = heard(events)
    assert heard_as(said, turn), f"the reply to {turn!r} sounds like {said!r}"


async def test_manual_commit_is_answered_with_speech_of_the_transcript() -> None:
    async with realtime_url() as url, open_realtime(url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        await send_audio(rt, pcm16(SENTENCE))
        await rt.send({"type": "input_audio_buffer.commit"})
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert not [e for e in events if e["type"].startswith("input_audio_buffer.speech")]
    assert_spoken_back(events, SENTENCE)


async def test_server_vad_answers_speech_then_silence_without_a_commit() -> None:
    async with realtime_url() as url, open_realtime(url) as rt:
        await rt.receive()
        await send_audio(rt, pcm16(SENTENCE, silence_after=1.0))
        events = await rt.receive_until("response.done")
    types = [e["type"] for e in events]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert [t for t in types if t in order] == order
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    assert events[-1]["response"]["status"] == "completed"
    assert_spoken_back(events, SENTENCE)


async def test_speech_sent_faster_than_real_time_is_transcribed_from_its_start() -> None:
    async with realtime_url() as url, open_realtime(url) as rt:
        await rt.receive()
        await send_audio(rt, pcm16(LONG, silence_after=1.0))  # longer than the idle input kept
        events = await rt.receive_until("response.done")
    assert heard_as(transcript(events), LONG)


async def test_speaking_over_a_response_cancels_it_and_silences_its_audio() -> None:
    async with realtime_url() as url, open_realtime(url) as rt:
        await rt.receive()
        barge_in = pcm16("Stop, please stop.", silence_after=0.2)
        await send_audio(rt, pcm16(LONGER, silence_after=1.0))
        await rt.receive_until("response.output_audio.delta")
        await send_audio(rt, barge_in)
        events = await rt.receive_until("response.done")
    types = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" in types
    after_barge_in = types[types.index("input_audio_buffer.speech_started") :]
    assert "response.output_audio.delta" not in after_barge_in
    assert not [t for t in types if t.startswith("output_audio_buffer.")]  # cancelled at once, as OpenAI does
    assert events[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}


async def test_a_session_past_the_asr_session_limit_is_refused_at_connect() -> None:
    async with realtime_url(["stream_asr.factory.max_sessions=1"]) as url, open_realtime(url) as first:
        await first.receive()
        await send_audio(first, pcm16("Hello.", silence_after=0.1))
        async with open_realtime(url) as second:
            error = (await second.receive())["error"]
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await second.receive()
    assert "max_realtime_sessions" in error["message"]
    assert error["code"] == "session_limit_reached"
    assert closed.value.reason.code == 1013


async def test_closing_the_socket_releases_the_asr_session() -> None:
    async with realtime_url(["stream_asr.factory.max_sessions=1"]) as url:
        for _ in range(2):
            async with open_realtime(url) as rt:
                await rt.receive()
                await send_audio(rt, pcm16(SENTENCE, silence_after=1.0))
                events = await rt.receive_until("response.done")
            assert events[-1]["response"]["status"] == "completed"
            # The server aborts the ASR session just after the socket closed.
            await settled_server(url.replace("ws://", "http://").removesuffix("/v1/realtime"))
