"""A speech-native pipeline's realtime sessions, against a toy pipeline: the turn's audio, not its
transcript, reaches the model, with the conversation as context (the real model: test_realtime_speech_native).

The toy answers every chat with ``echo:`` (0.1 s of tone then its transcript per word); ``slow`` in the
session's instructions makes it answer for 40 s, so a client can interrupt it.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import trio

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.config import ConfigError, validate
from omnitrio.config_loading import from_dict
from omnitrio.messages import CompleteMessage, StreamMessage
from omnitrio.serve.audio import REALTIME_RATE, float_to_pcm16, pcm16_to_float
from omnitrio.serve.context import ServeContext
from omnitrio.serve.realtime.session import RealtimeSession
from omnitrio.serve.realtime.speech_native import SpeechNative
from tests.fake_pipeline import FakePipeline, FakeRequest, Served, start_server
from tests.realtime_events import DELTAS, GA_AUDIO_RESPONSE


class SpeechNativeFake(FakePipeline):
    """The toy pipeline configured as a speech-native one whose stages know their voices; ``serves`` says
    whether it has ASR."""

    def __init__(self, serves: tuple[str, ...] = ("chat", "realtime")) -> None:
        super().__init__("fake-speech-native", audio_rate=24_000)
        self.config = SimpleNamespace(realtime_answer="speech-native", serves=list(serves), stage_voices=True)

    def _messages(self, request: FakeRequest, words: list[str]) -> AsyncGenerator[StreamMessage | CompleteMessage]:
        messages = request.inputs.get("messages") or [{}]
        system = messages[0].get("content") if messages[0].get("role") == "system" else ""
        return super()._messages(request, words + str(system).split())


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, SpeechNativeFake())


def chats(served: Served) -> list[FakeRequest]:
    return [request for request in served.fake.history if request.inputs["task"] == "chat"]


def tasks(served: Served) -> list[str]:
    """The tasks asked of the pipeline, but server VAD's (the session opens it before it is turned off)."""
    return [request.inputs["task"] for request in served.fake.history if request.inputs["task"] != "asr_session"]


async def manual_session(rt: RealtimeClient, **session: Any) -> list[dict[str, Any]]:
    """``session.created``, then server VAD off (the toy has no VAD stage) and ``session``; the events after."""
    await rt.receive()
    update = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session}
    await rt.send({"type": "session.update", "session": update})
    return await rt.receive_until("session.updated")


def spoken(seconds: float, frequency: float = 300.0) -> bytes:
    t = np.arange(int(seconds * REALTIME_RATE)) / REALTIME_RATE
    return float_to_pcm16((0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32))


async def commit(rt: RealtimeClient, pcm16: bytes) -> None:
    await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()})
    await rt.send({"type": "input_audio_buffer.commit"})
    await rt.receive_until("conversation.item.done")


async def answer(rt: RealtimeClient) -> list[dict[str, Any]]:
    await rt.send({"type": "response.create"})
    return await rt.receive_until("response.done")


def audio_part(message: dict[str, Any]) -> dict[str, Any]:
    (part,) = message["content"]
    assert part["type"] == "input_audio"
    return dict(part["input_audio"])


def test_realtime_answer_is_a_validated_pipeline_field_defaulting_to_the_cascade() -> None:
    stages = [{"name": "only", "factory_path": "tests.helpers.nothing", "terminal": True}]
    assert from_dict({"stages": stages}).realtime_answer == "cascade"
    config = from_dict({"stages": stages, "realtime_answer": "telepathy"})
    with pytest.raises(ConfigError, match="realtime_answer"):
        validate(config)


def test_a_session_of_a_speech_native_pipeline_answers_speech_natively() -> None:
    session = RealtimeSession(ServeContext(SpeechNativeFake(), realtime_answer="speech-native"), transport=None)  # type: ignore[arg-type]
    assert isinstance(session.answering, SpeechNative)


async def test_the_committed_audio_reaches_the_model_untranscribed_and_the_answer_speaks(served: Served) -> None:
    pcm16 = spoken(0.5)
    async with open_realtime(served.ws_url) as rt:
        await manual_session(rt)
        await commit(rt, pcm16)
        events = await answer(rt)
    (chat,) = chats(served)
    part = audio_part(chat.inputs["messages"][-1])
    assert part["sample_rate"] == REALTIME_RATE
    np.testing.assert_array_equal(part["array"], pcm16_to_float(pcm16))
    assert (chat.inputs["modalities"], tasks(served)) == (["text", "audio"], ["chat"])  # no transcription
    assert [e["type"] for e in events if e["type"] not in DELTAS] == GA_AUDIO_RESPONSE
    kinds = [e["type"] for e in events if e["type"] in DELTAS]
    assert kinds[:2] == ["response.output_audio.delta", "response.output_audio_transcript.delta"]
    assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == "echo: "


async def test_the_next_turn_hears_the_conversation_as_context(served: Served) -> None:
    first, second = spoken(0.4, 300.0), spoken(0.6, 500.0)
    async with open_realtime(served.ws_url) as rt:
        await manual_session(rt, instructions="Be brief.", temperature=0, audio={"output": {"voice": "chelsie"}})
        await commit(rt, first)
        await answer(rt)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and then?"}]}
        await rt.send({"type": "conversation.item.create", "item": item})
        await rt.receive_until("conversation.item.done")
        await commit(rt, second)
        await answer(rt)
    inputs = chats(served)[1].inputs
    system, heard, answered, typed, now = inputs["messages"]
    assert system == {"role": "system", "content": "Be brief."}
    np.testing.assert_array_equal(audio_part(heard)["array"], pcm16_to_float(first))
    assert answered == {"role": "assistant", "content": "echo:"}
    assert typed == {"role": "user", "content": "and then?"}
    np.testing.assert_array_equal(audio_part(now)["array"], pcm16_to_float(second))
    assert (inputs["audio"]["voice"], inputs["temperature"]) == ("chelsie", 0.0)  # a speaker of the model


async def test_a_text_only_session_asks_the_model_for_text_only(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_session(rt, output_modalities=["text"])
        await commit(rt, spoken(0.3))
        events = await answer(rt)
    assert chats(served)[0].inputs["modalities"] == ["text"]
    kinds = {e["type"] for e in events}
    assert "response.output_text.delta" in kinds and "response.output_audio.delta" not in kinds


async def test_input_transcription_without_an_asr_stage_is_an_error_naming_it(served: Served) -> None:
    asked = {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"type": "realtime", "audio": asked}})
        updated = await rt.receive_until("session.updated")
        while updated[-1]["type"] != "error" or updated[-1]["error"]["param"] is None:  # not server VAD's
            updated += await rt.receive_until("error")  # after session.updated: the settings hold
        await commit(rt, spoken(0.3))
        events = await answer(rt)
    error = updated[-1]["error"]
    assert (error["code"], error["param"]) == ("transcription_not_served", "session.audio.input.transcription")
    assert "ASR stage" in error["message"] and "'transcription'" in error["message"]
    assert events[-1]["response"]["status"] == "completed" and tasks(served) == ["chat"]
    assert not any(e["type"].startswith("conversation.item.input_audio_transcription") for e in events)


async def test_input_transcription_is_done_when_the_pipeline_has_asr(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, SpeechNativeFake(("chat", "transcription", "realtime")))
    asked = {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"type": "realtime", "audio": asked}})
        await rt.receive_until("session.updated")
        await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(spoken(0.5)).decode()})
        await rt.send({"type": "input_audio_buffer.commit"})
        completed = (await rt.receive_until("conversation.item.input_audio_transcription.completed"))[-1]
    assert completed["transcript"] == "heard 0.50 seconds"


async def test_cancelling_an_answer_aborts_its_request_and_keeps_what_was_heard(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_session(rt, instructions="slow")
        await commit(rt, spoken(0.3))
        await rt.send({"type": "response.create"})
        first = await rt.receive_until("response.output_audio.delta")
        item_id = first[-1]["item_id"]
        truncate = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 50}
        await rt.send(truncate)
        after = await rt.receive_until("response.done")
        await served.fake.idle()
    truncated = [e["type"] for e in after].index("conversation.item.truncated")
    assert "response.output_audio.delta" not in [e["type"] for e in after[truncated:]]
    assert after[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert chats(served)[0].outcome == "aborted" and not served.fake.live


async def test_a_g711_answer_keeps_every_sample_of_the_answer(served: Served) -> None:
    pcmu = {"input": {"turn_detection": None}, "output": {"format": {"type": "audio/pcmu"}}}
    async with open_realtime(served.ws_url) as rt:
        await manual_session(rt, audio=pcmu)
        await commit(rt, spoken(0.3))
        events = await answer(rt)
    sent = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert [e["type"] for e in events if e["type"] not in DELTAS] == GA_AUDIO_RESPONSE
    assert len(sent) == REALTIME_RATE // 10 // 3  # the toy's 0.1 s answer at 8 kHz, its filter's tail included


async def test_the_voice_page_asks_for_input_transcription_only_from_a_pipeline_with_asr(
    served: Served, nursery: trio.Nursery
) -> None:
    with_asr = await start_server(nursery, SpeechNativeFake(("chat", "transcription", "realtime")))
    async with httpx.AsyncClient() as client:
        without = (await client.get(f"{served.url}/voice.json")).json()
        with_it = (await client.get(f"{with_asr.url}/voice.json")).json()
    assert (without["transcribes"], with_it["transcribes"]) == (False, True)
