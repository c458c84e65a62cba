"""``WS /v1/realtime`` through the omnitrio client (trio-websocket), event by event."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import trio

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.audio import float_to_pcm16
from tests.fake_pipeline import FakeRequest, Served, start_server, tone


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


def one_second_b64() -> str:
    return base64.b64encode(float_to_pcm16(tone(1.0, 24_000, as_float=True))).decode()


async def receive_until(rt: RealtimeClient, event_type: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of ``event_type``."""
    events = []
    with trio.fail_after(5):
        while True:
            events.append(await rt.receive())
            if events[-1]["type"] == event_type:
                return events


def first_response(served: Served) -> FakeRequest:
    """The first response request the server made (the default server VAD also tries an ASR session)."""
    return next(request for request in served.fake.history if request.inputs["task"] == "realtime")


async def manual_turns(rt: RealtimeClient) -> None:
    """Take ``session.created``, then turn server VAD off: the client commits and asks for responses."""
    await rt.receive()
    await rt.send({"type": "session.update", "session": {"turn_detection": None}})
    await receive_until(rt, "session.updated")


async def commit_one_second(rt: RealtimeClient) -> None:
    await rt.send({"type": "input_audio_buffer.append", "audio": one_second_b64()})
    await rt.send({"type": "input_audio_buffer.commit"})
    await receive_until(rt, "input_audio_buffer.committed")


async def test_connect_sends_session_created_with_pcm16_24khz(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        event = await rt.receive()
    assert event["type"] == "session.created"
    assert event["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}


async def test_server_vad_is_the_default_turn_detection(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        event = await rt.receive()
    assert event["session"]["turn_detection"]["type"] == "server_vad"
    assert event["session"]["turn_detection"]["silence_duration_ms"] == 500


async def test_unsupported_turn_detection_is_an_error_naming_the_field(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad"}}})
        error = (await receive_until(rt, "error"))[-1]
    assert error["error"]["param"] == "session.turn_detection.type"


async def test_session_update_stores_turn_detection(served: Served) -> None:
    vad = {"type": "server_vad", "silence_duration_ms": 300}
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": vad, "instructions": "be brief"}})
        session = (await receive_until(rt, "session.updated"))[-1]["session"]
    assert session["turn_detection"] == vad
    assert session["audio"]["input"]["turn_detection"] == vad
    assert session["instructions"] == "be brief"


async def test_committed_audio_reaches_the_pipeline_as_16khz_float32(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await commit_one_second(rt)
        await rt.send({"type": "response.create"})
        await receive_until(rt, "response.done")
    audio = first_response(served).inputs["audio"]
    assert (audio.dtype, audio.shape) == (np.float32, (16_000,))


async def test_response_streams_audio_under_both_event_names_then_done(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await commit_one_second(rt)
        await rt.send({"type": "response.create"})
        events = await receive_until(rt, "response.done")
    types = [e["type"] for e in events]
    assert types[0] == "response.created"
    new = [e["delta"] for e in events if e["type"] == "response.output_audio.delta"]
    old = [e["delta"] for e in events if e["type"] == "response.audio.delta"]
    assert new == old
    assert len(b"".join(base64.b64decode(d) for d in new)) == 3 * 2400 * 2  # three words, 0.1 s each at 24 kHz
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == "heard 1.00 seconds "
    assert events[-1]["response"]["status"] == "completed"


async def test_clear_empties_the_input_buffer(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "input_audio_buffer.append", "audio": one_second_b64()})
        await rt.send({"type": "input_audio_buffer.clear"})
        await receive_until(rt, "input_audio_buffer.cleared")
        await rt.send({"type": "input_audio_buffer.commit"})
        error = (await receive_until(rt, "error"))[-1]
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"


async def slow_response(rt: RealtimeClient) -> None:
    await manual_turns(rt)
    await rt.send({"type": "session.update", "session": {"instructions": "slow"}})
    await commit_one_second(rt)
    await rt.send({"type": "response.create"})
    await receive_until(rt, "response.output_audio.delta")


async def test_response_cancel_aborts_the_request_and_reports_cancelled(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await slow_response(rt)
        await rt.send({"type": "response.cancel"})
        done = (await receive_until(rt, "response.done"))[-1]
    assert done["response"]["status"] == "cancelled"
    assert first_response(served).outcome == "aborted"


async def test_second_response_create_while_one_runs_is_an_error(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await slow_response(rt)
        await rt.send({"type": "response.create"})
        error = (await receive_until(rt, "error"))[-1]
    assert error["error"]["code"] == "conversation_already_has_active_response"


async def test_closing_the_socket_aborts_the_response(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await slow_response(rt)
    request = first_response(served)
    with trio.fail_after(2):
        await request.exited.wait()
    assert request.outcome == "aborted"


async def test_failed_response_reports_failed_and_keeps_the_session(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "session.update", "session": {"instructions": "fail"}})
        await rt.send({"type": "response.create"})
        done = (await receive_until(rt, "response.done"))[-1]
        await rt.send({"type": "input_audio_buffer.clear"})
        assert (await receive_until(rt, "input_audio_buffer.cleared"))[-1]["type"] == "input_audio_buffer.cleared"
    assert done["response"]["status"] == "failed"
    assert "fake failure on purpose" in done["response"]["status_details"]["error"]["message"]
