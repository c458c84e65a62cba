"""Client mistakes are 4xx answers that name the mistake, decided before any header is sent; a route
the pipeline does not serve is a 404 naming what it does serve. Clients: the official ``openai`` SDK,
httpx for raw HTTP, trio-websocket for the realtime upgrade."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import trio
import trio_websocket

from omnitrio.serve.openai_types import MAX_MESSAGE_CHARS, OPENAI_VOICES
from tests.fake_pipeline import FakePipeline, Served, start_server
from tests.test_serve_http import call, wav_bytes


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def refused(served: Served, fn: Callable[[Any], Any]) -> openai.APIStatusError:
    """The error the SDK raised: an answer with a status and an OpenAI error body, never a connection error."""
    with pytest.raises(openai.APIStatusError) as caught:
        await call(served, fn)
    error = caught.value
    assert isinstance(error.body, dict) and set(error.body) >= {"message", "type", "param", "code"}
    return error


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


# -- speech ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["...", "?!", "—"])
async def test_speech_with_nothing_to_speak_is_a_400_naming_the_input(served: Served, text: str) -> None:
    error = await refused(served, lambda c: c.audio.speech.create(model="fake-omni", voice="alloy", input=text))
    assert error.status_code == 400 and error.body["param"] == "input"  # type: ignore[index]
    assert "nothing to speak" in error.message and repr(text) in error.message
    assert served.fake.history == []


@pytest.mark.parametrize("text", ["...", "?!"])
async def test_speech_sse_with_nothing_to_speak_is_a_400_before_any_event(served: Served, text: str) -> None:
    body = {"input": text, "voice": "alloy", "response_format": "pcm", "stream_format": "sse"}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"


@pytest.mark.parametrize("response_format", ["pcm", "wav"])
async def test_speech_the_pipeline_gave_no_audio_is_an_error_answer_not_a_cut_body(
    served: Served, response_format: str
) -> None:
    error = await refused(
        served,
        lambda c: c.audio.speech.create(
            model="fake-omni", voice="alloy", input="mute please", response_format=response_format
        ),
    )
    assert error.status_code == 500 and error.body["code"] == "no_audio"  # type: ignore[index]


async def test_speech_sse_the_pipeline_gave_no_audio_is_an_error_answer(served: Served) -> None:
    body = {"input": "mute please", "response_format": "pcm", "stream_format": "sse"}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 500 and response.json()["error"]["code"] == "no_audio"


# -- voices ------------------------------------------------------------------------------------------


async def test_every_openai_voice_name_is_accepted(served: Served) -> None:
    for voice in (*OPENAI_VOICES, "default"):
        audio = await call(
            served,
            lambda c, v=voice: c.audio.speech.create(model="fake-omni", voice=v, input="hi", response_format="wav"),
        )
        assert audio.content[:4] == b"RIFF"


async def test_an_unknown_voice_is_a_400_listing_the_voices(served: Served) -> None:
    error = await refused(served, lambda c: c.audio.speech.create(model="fake-omni", voice="robot", input="hi"))
    assert error.status_code == 400 and error.body["param"] == "voice"  # type: ignore[index]
    assert "'robot'" in error.message and all(voice in error.message for voice in ("default", *OPENAI_VOICES))


async def test_an_unknown_chat_audio_voice_is_a_400(served: Served) -> None:
    error = await refused(
        served,
        lambda c: c.chat.completions.create(
            model="fake-omni",
            messages=user("hi"),
            modalities=["text", "audio"],
            audio={"voice": "robot", "format": "wav"},
        ),
    )
    assert error.status_code == 400 and error.body["param"] == "audio.voice"  # type: ignore[index]


# -- chat ----------------------------------------------------------------------------------------------


async def test_a_chat_message_over_the_size_limit_is_a_400_naming_it(served: Served) -> None:
    messages = [{"role": "system", "content": "be brief"}, *user("x" * (MAX_MESSAGE_CHARS + 1))]
    error = await refused(served, lambda c: c.chat.completions.create(model="fake-omni", messages=messages))
    assert error.status_code == 400 and error.body["param"] == "messages[1].content"  # type: ignore[index]
    assert error.body["code"] == "string_above_max_length"  # type: ignore[index]
    assert served.fake.history == []


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (user(""), "messages[0].content"),
        (user([{"type": "text", "text": "  "}]), "messages[0].content"),
        ([{"role": "system", "content": "be brief"}], "messages"),
    ],
)
async def test_chat_with_nothing_to_answer_is_a_400(served: Served, messages: Any, param: str) -> None:
    error = await refused(
        served,
        lambda c: c.chat.completions.create(
            model="fake-omni",
            messages=messages,
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        ),
    )
    assert error.status_code == 400 and error.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize(
    ("input_audio", "param", "phrase"),
    [
        ({"data": "not base64!", "format": "wav"}, ".data", "base64"),
        ({"data": base64.b64encode(b"RIFF....WAVE").decode(), "format": "wav"}, ".data", "could not decode"),
        ({"data": base64.b64encode(b"abc").decode(), "format": "pcm16"}, ".data", "even number"),
        ({"data": "", "format": "mp3"}, ".format", "'mp3'"),
        ({"format": "wav"}, "", "base64 'data'"),
    ],
)
async def test_an_input_audio_part_that_does_not_decode_is_a_400_naming_the_part(
    served: Served, input_audio: dict[str, Any], param: str, phrase: str
) -> None:
    messages = user([{"type": "text", "text": "listen"}, {"type": "input_audio", "input_audio": input_audio}])
    error = await refused(served, lambda c: c.chat.completions.create(model="fake-omni", messages=messages))
    assert error.status_code == 400
    assert error.body["param"] == "messages[0].content[1].input_audio" + param  # type: ignore[index]
    assert phrase in error.message and "<_io" not in error.message
    assert served.fake.history == []


async def test_a_decodable_input_audio_part_reaches_the_pipeline_as_sent(served: Served) -> None:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(0.2)).decode(), "format": "wav"}}
    await call(served, lambda c: c.chat.completions.create(model="fake-omni", messages=user([part])))
    assert served.fake.history[0].inputs["messages"] == user([part])


async def test_a_transcription_file_that_does_not_decode_names_the_reason_not_an_object(served: Served) -> None:
    error = await refused(
        served, lambda c: c.audio.transcriptions.create(model="fake-omni", file=("a.wav", b"not audio at all"))
    )
    assert error.status_code == 400 and "Format not recognised" in error.message
    assert "<_io" not in error.message and "object at 0x" not in error.message


# -- what the pipeline serves --------------------------------------------------------------------------


@pytest.fixture
async def chat_only(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, FakePipeline("chatty"), serves=["chat"])


async def test_models_say_what_each_model_serves(served: Served, chat_only: Served) -> None:
    everything = await call(served, lambda c: c.models.list().data)
    chat = await call(chat_only, lambda c: c.models.retrieve("chatty"))
    assert everything[0].serves == [
        "POST /v1/chat/completions",
        "POST /v1/audio/speech",
        "POST /v1/audio/transcriptions",
        "WS /v1/realtime",
    ]
    assert chat.serves == ["POST /v1/chat/completions"]


async def test_a_route_the_pipeline_does_not_serve_is_a_404_naming_what_it_serves(chat_only: Served) -> None:
    speech = await refused(chat_only, lambda c: c.audio.speech.create(model="chatty", voice="alloy", input="hi"))
    transcription = await refused(
        chat_only, lambda c: c.audio.transcriptions.create(model="chatty", file=("a.wav", wav_bytes(0.2)))
    )
    for error, route in ((speech, "POST /v1/audio/speech"), (transcription, "POST /v1/audio/transcriptions")):
        assert error.status_code == 404 and error.body["code"] == "route_not_served"  # type: ignore[index]
        assert f"does not serve {route}; it serves POST /v1/chat/completions" in error.message
    assert chat_only.fake.history == []


async def test_realtime_on_a_pipeline_without_it_refuses_the_upgrade_with_a_404(chat_only: Served) -> None:
    with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
        async with trio_websocket.open_websocket_url(chat_only.ws_url):
            pass
    assert rejected.value.status_code == 404
    assert b"it serves POST /v1/chat/completions" in (rejected.value.body or b"")


# -- /v1/realtime over plain HTTP -------------------------------------------------------------------------


async def test_plain_get_of_the_realtime_route_is_426_saying_to_use_a_websocket(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get("/v1/realtime")
    assert response.status_code == 426 and response.headers["upgrade"] == "websocket"
    assert "connect with a WebSocket client" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("headers", "phrase"),
    [
        ({"Upgrade": "irc/6.9"}, "the Upgrade header is 'irc/6.9'"),
        ({"Upgrade": "websocket", "Connection": "keep-alive"}, "'Connection: Upgrade'"),
    ],
)
async def test_a_bad_realtime_upgrade_says_what_was_wrong(served: Served, headers: dict[str, str], phrase: str) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get("/v1/realtime", headers=headers)
    assert response.status_code == 400 and phrase in response.json()["error"]["message"]


def test_a_config_that_serves_an_unknown_task_is_refused_naming_the_field() -> None:
    from omnitrio.config import validate
    from omnitrio.config_loading import from_dict
    from omnitrio.errors import ConfigError

    config = from_dict(
        {
            "serves": ["chat", "video"],
            "stages": [{"name": "a", "factory_path": "toys.stages.create_echo", "terminal": True}],
        }
    )
    with pytest.raises(
        ConfigError, match=r"serves: must name tasks from \['chat', 'speech', 'transcription', 'realtime'\]"
    ):
        validate(config)
