"""Admission at the door: 429 past the request limit, realtime sessions refused at connect, the limits."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
import trio_websocket

from omnitrio.cli import DEFAULT_CONFIG, main
from omnitrio.client import OmnitrioClient, open_realtime
from omnitrio.config_loading import load
from omnitrio.serve.limits import ServeLimits, limits_for
from tests.fake_pipeline import Served, start_server
from tests.test_serve_http import wav_bytes

SLOW = [{"role": "user", "content": "slow"}]


async def test_a_request_past_the_concurrency_limit_gets_429_with_retry_after(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_concurrent_requests=1))

    async def hold_a_stream(task_status: trio.TaskStatus[None]) -> None:
        async with OmnitrioClient(served.url) as client:
            stream = client.chat_stream(SLOW)
            await anext(stream)  # the response has begun: its place is taken
            task_status.started()
            async for _ in stream:
                pass

    async with trio.open_nursery() as holding:
        await holding.start(hold_a_stream)
        async with httpx.AsyncClient(base_url=served.url) as client:
            refused = await client.get("/v1/models")
            health = await client.get("/health")
        holding.cancel_scope.cancel()
    await served.fake.idle()
    async with OmnitrioClient(served.url) as again:
        models = await again.models()
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert "max_concurrent_requests" in refused.json()["error"]["message"]
    assert health.status_code == 200  # /health is never held back
    assert models[0] == "fake-omni"  # then the OpenAI names it answers to


async def connect_refused(served: Served) -> tuple[dict[str, object], int | None]:
    """The one event and the close code a refused realtime connection gets."""
    async with trio_websocket.open_websocket_url(served.ws_url) as ws:
        with trio.fail_after(5):
            event = json.loads(await ws.get_message())
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
    return event, closed.value.reason.code if closed.value.reason else None


async def test_a_realtime_session_past_the_limit_is_refused_at_connect_with_1013(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_realtime_sessions=1))
    async with open_realtime(served.ws_url) as first:
        assert (await first.receive())["type"] == "session.created"
        before = len(served.fake.history)
        event, code = await connect_refused(served)
        assert len(served.fake.history) == before  # nothing of the refused session reached the pipeline
    assert event["type"] == "error"
    error = event["error"]
    assert isinstance(error, dict)
    assert error["code"] == "session_limit_reached"
    assert "max_realtime_sessions" in error["message"]
    assert code == 1013


async def test_a_closed_session_makes_room_for_the_next(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_realtime_sessions=1))
    for _ in range(3):
        async with open_realtime(served.ws_url) as rt:
            with trio.fail_after(5):
                assert (await rt.receive())["type"] == "session.created"
        await served.fake.idle()  # the session's ASR listener is aborted after the socket closed
        await trio.testing.wait_all_tasks_blocked()  # the server has finished with the session


async def test_an_upload_longer_than_max_audio_seconds_is_413(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_audio_seconds=1.0))
    async with httpx.AsyncClient(base_url=served.url) as client:
        short = await client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(0.5))})
        long = await client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(2.0))})
    assert short.status_code == 200
    assert long.status_code == 413
    assert long.json()["error"]["code"] == "audio_too_long"
    assert served.fake.history[-1].inputs["audio"].size == 8000  # only the short one reached the pipeline


async def test_a_realtime_message_past_max_event_bytes_gets_an_error_naming_the_limit_then_1009(
    nursery: trio.Nursery,
) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_event_bytes=64 * 1024))
    events = []
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "input_audio_buffer.append", "audio": "AAAA" * 20_000})
        with trio.fail_after(5), pytest.raises(trio_websocket.ConnectionClosed) as closed:
            while True:
                events.append(await rt.receive())
    errors = [event["error"] for event in events if event["type"] == "error" and "turn detection" not in str(event)]
    assert [error["code"] for error in errors] == ["event_too_large"]
    assert "limit of 65536 bytes (max_event_bytes)" in errors[0]["message"]
    assert closed.value.reason.code == 1009 and "65536" in (closed.value.reason.reason or "")
    async with httpx.AsyncClient(base_url=served.url) as client:
        assert (await client.get("/health")).status_code == 200


def test_the_session_limit_defaults_to_the_pipelines_session_stages() -> None:
    assert limits_for(load(DEFAULT_CONFIG)).max_realtime_sessions == 64
    assert limits_for(load(DEFAULT_CONFIG, ["stream_asr.factory.max_sessions=3"])).max_realtime_sessions == 3
    assert limits_for(None) == ServeLimits()
    assert limits_for(None, ["max_concurrent_requests=9"]).max_concurrent_requests == 9


@pytest.mark.parametrize(
    ("setting", "named"),
    [("sessions=3", "max_realtime_sessions"), ("max_body_bytes=lots", "integer"), ("max_audio_seconds=0", "positive")],
)
def test_a_bad_limit_setting_is_an_error_naming_it(setting: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        limits_for(None, [setting])


def test_check_prints_the_limits_the_pipeline_would_be_served_with(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(DEFAULT_CONFIG), "--set", "stream_asr.factory.max_sessions=5"]) == 0
    out = capsys.readouterr().out
    assert "max_realtime_sessions = 5" in out
    assert "stream_asr max_sessions=5" in out
    assert "max_concurrent_requests = 256" in out
    assert "max_body_bytes = 26214400" in out


def test_serve_with_a_bad_limit_or_key_exits_2_before_loading_models(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "--limit", "max_realtime_sessions=-1"]) == 2
    assert "max_realtime_sessions" in capsys.readouterr().err
    assert main(["serve", "--api-key", "two words"]) == 2
    assert "API key" in capsys.readouterr().err
