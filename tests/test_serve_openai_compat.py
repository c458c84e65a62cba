"""What code written for OpenAI gets back: its error classes and codes, its model names, its parameters.

Clients: the official ``openai`` SDK (it raises ``BadRequestError`` for a 400, ``NotFoundError``
for a 404), httpx for raw HTTP and SSE, trio-websocket for the realtime socket.
"""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import openai
import pytest
import trio
import trio_websocket

from omnitrio.serve.model_names import MODEL_ALIASES
from omnitrio.serve.openai_types import CHAT_HINTS
from tests.fake_pipeline import Served, start_server
from tests.test_serve_http import call, wav_bytes
from tests.test_serve_mistakes import refused, user

CHAT = "/v1/chat/completions"


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


# -- a request that cannot fit the context ------------------------------------------------------------


async def test_a_request_over_the_context_is_a_400_context_length_exceeded(served: Served) -> None:
    error = await refused(served, lambda c: c.chat.completions.create(model="fake-omni", messages=user("toolong")))
    assert isinstance(error, openai.BadRequestError)
    assert error.code == "context_length_exceeded" and error.param == "messages"
    assert "maximum context length is 1024 tokens" in error.message


async def test_a_streamed_request_over_the_context_is_a_400_not_a_200_then_an_error_event(served: Served) -> None:
    body = {"model": "fake-omni", "messages": user("toolong"), "stream": True}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(CHAT, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_a_request_over_the_context_is_a_realtime_error_event_naming_the_code(served: Served) -> None:
    async with trio_websocket.open_websocket_url(served.ws_url) as ws:
        await ws.get_message()  # session.created
        session = {"instructions": "toolong", "turn_detection": None}
        await ws.send_message(json.dumps({"type": "session.update", "session": session}))
        await ws.send_message(json.dumps({"type": "response.create"}))
        events = []
        with trio.fail_after(10):
            while not events or events[-1]["type"] != "response.done":
                events.append(json.loads(await ws.get_message()))
    errors = [event["error"] for event in events if event["type"] == "error" and "turn detection" not in str(event)]
    assert [(error["type"], error["code"]) for error in errors] == [
        ("invalid_request_error", "context_length_exceeded")
    ]
    assert events[-1]["response"]["status"] == "failed"


# -- validation errors are 400, as OpenAI's ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"logit_bias": {"the": 1}}, "logit_bias"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"modalities": ["video"]}, "modalities"),
    ],
)
async def test_a_chat_value_out_of_range_raises_the_sdks_bad_request_error(
    served: Served, fields: dict[str, Any], param: str
) -> None:
    arguments = {"model": "fake-omni", "messages": user("hi"), **fields}
    error = await refused(served, lambda c: c.chat.completions.create(**arguments))
    assert isinstance(error, openai.BadRequestError)
    assert error.param == param and error.body["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "param"), [({"speed": 100}, "speed"), ({"response_format": "mp4"}, "response_format")]
)
async def test_a_speech_value_out_of_range_raises_the_sdks_bad_request_error(
    served: Served, fields: dict[str, Any], param: str
) -> None:
    error = await refused(
        served, lambda c: c.audio.speech.create(model="fake-omni", voice="alloy", input="hi", **fields)
    )
    assert isinstance(error, openai.BadRequestError) and error.param == param


async def test_a_transcription_format_not_served_raises_the_sdks_bad_request_error(served: Served) -> None:
    error = await refused(
        served,
        lambda c: c.audio.transcriptions.create(
            model="fake-omni", file=("a.wav", wav_bytes(0.2)), response_format="srt"
        ),
    )
    assert isinstance(error, openai.BadRequestError) and error.param == "response_format"


# -- parameters: honoured, refused by name, or documented hints -----------------------------------------


async def test_an_unknown_chat_field_is_a_400_naming_it(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(CHAT, json={"messages": user("hi"), "temperture": 0.5})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "temperture" and "temperture" in error["message"]
    assert served.fake.history == []


async def test_an_unknown_speech_field_is_a_400_naming_it(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json={"input": "hi", "pitch": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "pitch"


async def test_openais_optional_hints_are_accepted(served: Served) -> None:
    hints = {name: None for name in CHAT_HINTS} | {"user": "u1", "store": False, "metadata": {"k": "v"}}
    body = {"messages": user("hi"), "logprobs": False, "stream_options": {"include_usage": True}, **hints}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(CHAT, json=body)
    assert response.status_code == 200, response.text


async def test_sampling_parameters_reach_the_pipeline_with_token_ids_as_ints(served: Served) -> None:
    await call(
        served,
        lambda c: c.chat.completions.create(
            model="fake-omni",
            messages=user("hi"),
            frequency_penalty=1.5,
            presence_penalty=-0.5,
            logit_bias={"42": -100, "7": 2.5},
            seed=3,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            tool_choice="auto",
        ),
    )
    inputs = served.fake.history[0].inputs
    assert (inputs["frequency_penalty"], inputs["presence_penalty"], inputs["seed"]) == (1.5, -0.5, 3)
    assert inputs["logit_bias"] == {42: -100.0, 7: 2.5}
    assert inputs["tools"][0]["function"]["name"] == "f" and inputs["tool_choice"] == "auto"


async def test_whether_the_answer_streams_reaches_the_pipeline(served: Served) -> None:
    await call(served, lambda c: c.chat.completions.create(model="fake-omni", messages=user("hi")))
    await call(served, lambda c: list(c.chat.completions.create(model="fake-omni", messages=user("hi"), stream=True)))
    assert [entry.inputs["stream"] for entry in served.fake.history] == [False, True]


# -- transcription ------------------------------------------------------------------------------------


async def test_verbose_json_gives_the_language_and_timed_segments_and_words_when_asked(served: Served) -> None:
    verbose = await call(
        served,
        lambda c: c.audio.transcriptions.create(
            model="whisper-1",
            file=("a.wav", wav_bytes(0.5)),
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        ),
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(0.5)
    assert verbose.segments[0].end == pytest.approx(0.5) and verbose.segments[0].text == verbose.text
    assert [word.word for word in verbose.words] == ["heard", "0.50", "seconds"]
    assert served.fake.history[0].inputs["timestamps"] == "word"


async def test_an_unknown_transcription_form_field_is_a_400_naming_it(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(
            "/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(0.2))}, data={"langauge": "en"}
        )
    assert response.status_code == 400 and response.json()["error"]["param"] == "langauge"


# -- speech formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac"])
async def test_speech_in_an_encoded_format_decodes_back_to_the_pipelines_audio(
    served: Served, response_format: str
) -> None:
    av = pytest.importorskip("av")
    body = {"input": "one two three", "voice": "alloy", "response_format": response_format}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("audio/")
    with av.open(io.BytesIO(response.content)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        assert stream.codec_context.name.startswith(response_format)
    rate = 48_000 if response_format == "opus" else 16_000  # Ogg Opus decodes at 48 kHz; the fake speaks at 16 kHz
    assert stream.rate == rate
    # 0.1 s a word: "echo:" and three words (AAC adds up to two frames of priming and padding)
    assert 0.4 <= samples / rate <= 0.4 + (2 * 1024 / rate if response_format == "aac" else 0.01)


async def test_speech_is_mp3_unless_asked_otherwise(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "alloy"})
    assert response.headers["content-type"] == "audio/mpeg"


# -- OpenAI's model names --------------------------------------------------------------------------------


async def test_openai_model_names_are_accepted_on_their_routes(served: Served) -> None:
    await call(served, lambda c: c.chat.completions.create(model="gpt-4o-mini", messages=user("hi")))
    await call(served, lambda c: c.audio.speech.create(model="tts-1", voice="alloy", input="hi"))
    await call(served, lambda c: c.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy", input="hi"))
    for model in ("whisper-1", "gpt-4o-mini-transcribe", "gpt-4o-transcribe"):
        await call(served, lambda c, m=model: c.audio.transcriptions.create(model=m, file=("a.wav", wav_bytes(0.2))))
    assert len(served.fake.history) == 6


async def test_a_dated_version_of_an_openai_name_is_accepted_and_a_lookalike_is_not(served: Served) -> None:
    await call(served, lambda c: c.chat.completions.create(model="gpt-4o-mini-2024-07-18", messages=user("hi")))
    error = await refused(served, lambda c: c.chat.completions.create(model="gpt-4o-miniature", messages=user("hi")))
    assert isinstance(error, openai.NotFoundError) and error.code == "model_not_found"


async def test_models_lists_each_alias_as_an_alias_of_the_served_pipeline(served: Served) -> None:
    cards = {m.id: m for m in await call(served, lambda c: list(c.models.list()))}
    for task in ("chat", "speech", "transcription", "realtime"):
        for alias in MODEL_ALIASES[task]:
            assert "alias of 'fake-omni'" in cards[alias].owned_by
    assert (await call(served, lambda c: c.models.retrieve("whisper-1"))).id == "whisper-1"


async def test_an_unknown_model_is_a_404_naming_the_served_model(served: Served) -> None:
    error = await refused(served, lambda c: c.chat.completions.create(model="gpt-2", messages=user("hi")))
    assert isinstance(error, openai.NotFoundError) and error.code == "model_not_found"
    assert "'fake-omni'" in error.message and "gpt-4o-mini" in error.message


async def test_another_routes_model_name_is_refused(served: Served) -> None:
    error = await refused(served, lambda c: c.chat.completions.create(model="whisper-1", messages=user("hi")))
    assert isinstance(error, openai.NotFoundError) and error.code == "model_not_found"


async def test_a_realtime_model_not_served_gets_an_error_event_then_the_close(served: Served) -> None:
    async with trio_websocket.open_websocket_url(served.ws_url + "?model=gpt-2") as ws:
        event = json.loads(await ws.get_message())
        with pytest.raises(trio_websocket.ConnectionClosed) as closed:
            await ws.get_message()
    assert event["type"] == "error" and event["error"]["code"] == "model_not_found"
    assert "'fake-omni'" in event["error"]["message"]
    assert closed.value.reason.code == 1008


@pytest.mark.parametrize("model", ["gpt-realtime", "gpt-realtime-2.1", "gpt-4o-realtime-preview-2024-12-17"])
async def test_a_realtime_openai_model_name_opens_the_session(served: Served, model: str) -> None:
    async with trio_websocket.open_websocket_url(served.ws_url + f"?model={model}") as ws:
        event = json.loads(await ws.get_message())
    assert event["type"] == "session.created"
