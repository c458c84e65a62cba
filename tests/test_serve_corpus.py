"""Malformed requests and realtime events get a 4xx (or an ``error`` event) naming the problem,
and the server stays healthy and keeps serving afterwards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from omnitrio.client import open_realtime
from tests.fake_pipeline import Served, start_server
from tests.test_serve_realtime import manual_turns

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
TRANSCRIBE = "/v1/audio/transcriptions"
USER = [{"role": "user", "content": "x"}]

# (route, body: bytes for raw, dict for JSON, status, the field or phrase the message must name)
HTTP_CORPUS: list[tuple[str, Any, int, str]] = [
    (CHAT, b"{not json", 400, "not valid JSON"),
    (CHAT, b"[1, 2]", 400, "object"),
    (CHAT, b"", 400, "not valid JSON"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"content": "x"}]}, 400, "role"),
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    (CHAT, {"messages": USER, "stream": "yes"}, 400, "stream"),
    (CHAT, {"messages": USER, "temperature": 9}, 400, "temperature"),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "modalities": ["video"]}, 400, "video"),
    (CHAT, {"messages": USER, "audio": {"format": "mp3"}}, 400, "audio.format"),
    (CHAT, {"messages": USER, "n": 3}, 400, "n"),
    (CHAT, {"messages": USER, "model": "nope"}, 404, "nope"),
    (SPEECH, {"voice": "a"}, 400, "input"),
    (SPEECH, {"input": ""}, 400, "input"),
    (SPEECH, {"input": "x" * 5000}, 400, "input"),
    (SPEECH, {"input": "x", "response_format": "mp4"}, 400, "response_format"),
    (SPEECH, {"input": "x", "stream_format": "ws"}, 400, "stream_format"),
    (SPEECH, {"input": "x", "speed": 10}, 400, "speed"),
    (TRANSCRIBE, {"file": "x"}, 400, "multipart"),
    ("/v1/nothing", {}, 404, "/v1/nothing"),
]


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


@pytest.mark.parametrize(("route", "body", "status", "named"), HTTP_CORPUS)
async def test_malformed_request_is_answered_with_an_openai_error(
    served: Served, route: str, body: Any, status: int, named: str
) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = await client.post(route, content=content, headers={"content-type": "application/json"})
        health = await client.get("/health")
    error = response.json()["error"]
    assert response.status_code == status
    assert named in error["message"] or named == error["param"]
    assert set(error) == {"message", "type", "param", "code"}
    assert health.status_code == 200


@pytest.mark.parametrize(
    ("files", "data", "status", "named"),
    [
        ({"file": ("a.wav", b"RIFF not really a wav")}, {}, 400, "decode"),
        ({"file": ("a.wav", b"")}, {}, 400, "empty"),
        ({}, {"model": "fake-omni"}, 400, "file"),
        ({"file": ("a.wav", b"x")}, {"response_format": "srt"}, 400, "response_format"),
        ({"file": ("a.wav", b"x")}, {"stream": "maybe"}, 400, "stream"),
        ({"file": ("a.wav", b"x")}, {"model": "other"}, 404, "other"),
    ],
)
async def test_malformed_transcription_upload_is_a_4xx(
    served: Served, files: dict[str, Any], data: dict[str, str], status: int, named: str
) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(TRANSCRIBE, files=files or {"unrelated": ("x", b"x")}, data=data)
    assert response.status_code == status
    error = response.json()["error"]
    assert named in error["message"] or named == error["param"]


async def test_wrong_method_is_405_with_an_openai_error(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.get(CHAT)
    assert response.status_code == 405
    assert "GET" in response.json()["error"]["message"]


REALTIME_CORPUS: list[tuple[str, str]] = [
    ("not json", "invalid_json"),
    ("[1]", "invalid_event"),
    ('{"no": "type"}', "missing_required_parameter"),
    ('{"type": 7}', "missing_required_parameter"),
    ('{"type": "conversation.teleport"}', "unknown_event"),
    ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
    ('{"type": "input_audio_buffer.append", "audio": "%%%not base64"}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', "invalid_value"),
    ('{"type": "input_audio_buffer.commit"}', "input_audio_buffer_commit_empty"),
    ('{"type": "response.cancel"}', "response_cancel_not_active"),
    ('{"type": "response.create", "response": 5}', "invalid_value"),
    ('{"type": "session.update"}', "missing_required_parameter"),
    ('{"type": "session.update", "session": {"type": "transcription"}}', "invalid_value"),
    ('{"type": "session.update", "session": {"input_audio_format": "g722"}}', "invalid_value"),
    (
        '{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}}',
        "invalid_value",
    ),
    ('{"type": "session.update", "session": {"turn_detection": "on"}}', "invalid_value"),
]


@pytest.mark.parametrize(("frame", "code"), REALTIME_CORPUS)
async def test_malformed_realtime_event_gets_an_error_event_and_the_socket_stays_open(
    served: Served, frame: str, code: str
) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.connection.send_message(frame)
        with trio.fail_after(5):
            error = await rt.receive()
            await rt.send({"type": "session.update", "session": {}})
            follow_up = await rt.receive()
    assert error["type"] == "error"
    assert error["error"]["code"] == code
    assert error["error"]["message"]
    assert follow_up["type"] == "session.updated"


async def test_binary_realtime_frame_is_an_error_event(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.connection.send_message(b"\x00\x01")
        with trio.fail_after(5):
            error = await rt.receive()
    assert error["error"]["code"] == "invalid_frame"
