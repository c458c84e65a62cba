"""OpenAI Realtime conformance of ``python -m omnitrio serve`` (the default speech pipeline).

Driven as users drive it: the official ``openai`` SDK's realtime client (GA protocol) and a raw
WebSocket client that asks for the beta protocol. Every event received is checked against the
SDK's own type for its name (so the fields the API reference lists are there, with their types),
and the order of events against the API reference. Speech to send comes from the server itself
(``/v1/audio/speech``, 24 kHz PCM16); what the answer says is checked against what was sent (the
server runs the "repeat" responder, which says the user's words back).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
import trio
import trio_websocket
from openai.types.beta.realtime import RealtimeServerEvent as BetaEvent
from openai.types.realtime import RealtimeServerEvent as GaEvent

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.realtime_pacing import DEFAULT_LEAD, PIECE_SECONDS
from tests.test_serve_realtime import GA_AUDIO_RESPONSE
from tests.test_speech_roundtrip import heard_as

pytest.importorskip("piper", reason="the speech extra is not installed")

ROOT = Path(__file__).resolve().parent.parent
RATE = 24_000
SENTENCE = "Turn left at the second traffic light."
THREE = "The train leaves at nine. The library closes at ten tonight. We need more chairs."
GA = pydantic.TypeAdapter(GaEvent)
BETA = pydantic.TypeAdapter(BetaEvent)
DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta"}
OMNITRIO_EVENTS = {
    "output_audio_buffer.paused": {"event_id", "response_id", "audio_end_ms", "decide_ms"},
    "output_audio_buffer.resumed": {"event_id", "response_id", "reason", "transcript"},
}


class Server:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/realtime"

    def speech(self, text: str, silence_after: float = 0.0) -> bytes:
        """``text`` spoken by the server's voice, 24 kHz PCM16, with 0.2 s of silence before."""
        body = {"model": "omnitrio-speech", "input": text, "voice": "default", "response_format": "pcm"}
        pcm = httpx.post(f"{self.url}/v1/audio/speech", json=body, timeout=60).content
        return bytes(2 * RATE // 5) + pcm + bytes(2 * int(silence_after * RATE))


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """``python -m omnitrio serve`` on a free port, as a user starts it."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "omnitrio", "serve", "--port", "0", "--set", "responder.factory.mode=repeat"],
            cwd=ROOT,
            stderr=log,
            env=dict(os.environ),
        )
        try:
            deadline = time.monotonic() + 110
            port = None
            while port is None:
                assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
                log.seek(0)
                found = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", log.read())
                port = int(found.group(1)) if found else None
            yield Server(port)
        finally:
            process.send_signal(signal.SIGINT)  # as a user stops it: the server drains, stages exit
            process.wait(30)


def checked(event: dict[str, Any], *, beta: bool = False) -> dict[str, Any]:
    """``event``, after checking it against the SDK's type of that name (GA or beta).

    The SDK lists OpenAI's own model and voice names; this server's names stand in their place.
    """
    if event["type"] in OMNITRIO_EVENTS:  # extensions (omnitrio.serve.realtime_interruption)
        assert OMNITRIO_EVENTS[event["type"]] <= event.keys()
        return event
    named = json.loads(json.dumps(event))
    if isinstance(named.get("session"), dict):
        named["session"].update(model="gpt-realtime", voice="alloy")
        if not beta:
            named["session"]["audio"]["output"]["voice"] = "alloy"
    if isinstance(named.get("response"), dict) and not beta:
        named["response"]["audio"]["output"]["voice"] = "alloy"
    (BETA if beta else GA).validate_python(named)
    return event


async def receive_until(rt: RealtimeClient, event_type: str, *, beta: bool = False) -> list[dict[str, Any]]:
    events = []
    with trio.fail_after(60):
        while True:
            events.append(checked(await rt.receive(), beta=beta))
            if events[-1]["type"] == event_type:
                return events


def audio_of(events: list[dict[str, Any]], name: str = "response.output_audio.delta") -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == name)


def sdk_session(server: Server, steps: Any) -> list[dict[str, Any]]:
    """Run ``steps(connection, receive_until)`` with the openai SDK's realtime client (in a thread)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    events: list[dict[str, Any]] = []

    with client.realtime.connect(model="omnitrio-speech") as connection:

        def until(event_type: str) -> list[dict[str, Any]]:
            start = len(events)
            while True:
                events.append(checked(json.loads(connection.recv_bytes())))
                if events[-1]["type"] == event_type:
                    return events[start:]

        until("session.created")
        steps(connection, until)
    return events


async def in_thread(*args: Any) -> Any:
    """Run a blocking client in a thread; a hung one fails the test after 60 s (the thread is left)."""
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(*args, abandon_on_cancel=True)


def response_part(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    start = next(i for i, e in enumerate(events) if e["type"] == "response.created")
    return events[start:]


async def test_sdk_text_in_gets_the_ga_sequence_and_speech(server: Server) -> None:
    def steps(connection: Any, until: Any) -> None:
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        until("session.updated")
        content = [{"type": "input_text", "text": SENTENCE}]
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": content})
        until("conversation.item.done")
        connection.response.create()
        until("response.done")

    events = response_part(await in_thread(sdk_session, server, steps))
    types = [e["type"] for e in events]
    assert [t for t in types if t not in DELTAS] == GA_AUDIO_RESPONSE
    assert len({e["event_id"] for e in events}) == len(events)
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == transcript == SENTENCE
    assert len(audio_of(events)) > RATE  # more than half a second of speech


async def test_sdk_manual_commit_is_transcribed_then_answered(server: Server) -> None:
    pcm = await trio.to_thread.run_sync(server.speech, SENTENCE)

    def steps(connection: Any, until: Any) -> None:
        audio = {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}
        connection.session.update(session={"type": "realtime", "audio": audio})
        until("session.updated")
        connection.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        connection.input_audio_buffer.commit()
        connection.response.create()
        until("response.done")

    events = await in_thread(sdk_session, server, steps)
    types = [e["type"] for e in events]
    item_id = next(e for e in events if e["type"] == "input_audio_buffer.committed")["item_id"]
    for name in ("conversation.item.added", "conversation.item.done"):
        assert types.index(name) < types.index("conversation.item.input_audio_transcription.completed")
    completed = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == item_id
    assert heard_as(completed["transcript"], SENTENCE)
    reply = next(e for e in events if e["type"] == "response.done")["response"]["output"][0]["content"][0]
    assert reply["transcript"] == completed["transcript"]


async def test_a_hand_commit_with_server_vad_on_is_not_cancelled_by_its_own_audio(server: Server) -> None:
    pcm = await trio.to_thread.run_sync(server.speech, SENTENCE, 0.8)
    async with open_realtime(server.ws_url) as rt:
        await rt.receive()
        for i in range(0, len(pcm), 2 * RATE // 10):
            await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 4800]).decode()})
        await rt.send({"type": "input_audio_buffer.commit"})
        await rt.send({"type": "response.create"})
        events = await receive_until(rt, "response.done")
        await rt.send({"type": "input_audio_buffer.clear"})
        events += await receive_until(rt, "input_audio_buffer.cleared")
    types = [e["type"] for e in events]
    assert not [t for t in types if t.startswith("input_audio_buffer.speech")]
    assert types.count("response.created") == 1
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "completed"
    assert heard_as(done["output"][0]["content"][0]["transcript"], SENTENCE)


@asynccontextmanager
async def open_beta(url: str) -> AsyncIterator[RealtimeClient]:
    headers = [("OpenAI-Beta", "realtime=v1")]
    async with trio_websocket.open_websocket_url(
        url, extra_headers=headers, message_queue_size=256, max_message_size=1 << 24
    ) as connection:
        yield RealtimeClient(connection)


async def test_a_beta_client_talking_with_server_vad_gets_beta_events_only(server: Server) -> None:
    pcm = await trio.to_thread.run_sync(server.speech, SENTENCE, 1.2)
    async with open_beta(server.ws_url) as rt:
        created = checked(await rt.receive(), beta=True)
        for i in range(0, len(pcm), 4800):
            await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + 4800]).decode()})
        events = await receive_until(rt, "response.done", beta=True)
    types = [e["type"] for e in events]
    assert created["session"]["turn_detection"]["type"] == "server_vad"
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.audio.done",
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert [t for t in types if t in order] == order
    assert not [
        t for t in types if t.startswith(("response.output_audio", "response.output_text", "conversation.item.added"))
    ]
    assert heard_as(events[-1]["response"]["output"][0]["content"][0]["transcript"], SENTENCE)
    assert audio_of(events, "response.audio.delta")


async def text_turn(rt: RealtimeClient, text: str) -> None:
    content = [{"type": "input_text", "text": text}]
    await rt.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}})
    await rt.send({"type": "response.create"})


async def test_truncate_cuts_audio_and_transcript_to_what_was_heard(server: Server) -> None:
    async with open_realtime(server.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await text_turn(rt, THREE)
        events = await receive_until(rt, "response.done")
        # Each sentence's transcript delta comes just before its audio: where each sentence starts.
        starts, received = [], 0
        for event in events:
            match event["type"]:
                case "response.output_audio_transcript.delta":
                    starts.append((received // 2, event["delta"].strip()))
                case "response.output_audio.delta":
                    received += len(base64.b64decode(event["delta"]))
        item_id = events[-1]["response"]["output"][0]["id"]
        (second_start, _), (third_start, _) = starts[1], starts[2]
        end_ms = (second_start + (third_start - second_start) * 3 // 5) * 1000 // RATE
        await rt.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": end_ms}
        )
        truncated = (await receive_until(rt, "conversation.item.truncated"))[-1]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await receive_until(rt, "conversation.item.retrieved"))[-1]["item"]
    assert [text for _, text in starts] == [
        "The train leaves at nine.",
        "The library closes at ten tonight.",
        "We need more chairs.",
    ]
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, end_ms)
    heard = item["content"][0]["transcript"]
    # Three fifths of "The library closes at ten tonight." in characters, cut back to a whole word.
    assert heard == "The train leaves at nine. The library closes"
    assert len(base64.b64decode(item["content"][0]["audio"])) == end_ms * RATE // 1000 * 2


async def test_barge_in_stops_the_answer_and_leaves_at_most_the_lead(server: Server) -> None:
    interruption = await trio.to_thread.run_sync(server.speech, "Stop, please stop.", 0.6)
    async with open_realtime(server.ws_url) as rt:
        await rt.receive()
        await text_turn(rt, THREE + " " + THREE)
        await receive_until(rt, "response.output_audio.delta")
        first_audio = trio.current_time()
        for i in range(0, len(interruption), 4800):
            chunk = base64.b64encode(interruption[i : i + 4800]).decode()
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        events = await receive_until(rt, "input_audio_buffer.speech_started")
        held = (len(audio_of(events)) / 2 + 4800) / RATE - (trio.current_time() - first_audio)
        events += await receive_until(rt, "response.done")
    after = [e["type"] for e in events[events.index(next(e for e in events if e["type"].endswith("speech_started"))) :]]
    assert "response.output_audio.delta" not in after
    assert held <= DEFAULT_LEAD + 2 * PIECE_SECONDS
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"


async def test_sdk_response_cancel_reports_cancelled(server: Server) -> None:
    def steps(connection: Any, until: Any) -> None:
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        until("session.updated")
        content = [{"type": "input_text", "text": THREE}]
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": content})
        connection.response.create()
        until("response.output_audio.delta")
        first = time.monotonic()
        time.sleep(0.5)  # unpaced, seconds of the answer would have come by now
        connection.response.cancel()
        until("response.done")
        played.append(time.monotonic() - first)

    played: list[float] = []
    events = response_part(await in_thread(sdk_session, server, steps))
    done = events[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")
    assert len(audio_of(events)) / 2 / RATE <= played[0] + DEFAULT_LEAD + 2 * PIECE_SECONDS
    types = [e["type"] for e in events]
    assert [t for t in types if t not in DELTAS] == GA_AUDIO_RESPONSE


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "session.dance"}, "unknown_event", "type"),
        ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_base64", "audio"),
        (
            {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": "hi"}},
            "invalid_value",
            "item.content",
        ),
        ({"type": "conversation.item.retrieve", "item_id": "item-missing"}, "item_not_found", "item_id"),
    ],
)
async def test_a_bad_event_is_an_error_naming_it(server: Server, event: dict[str, Any], code: str, param: str) -> None:
    async with open_realtime(server.ws_url) as rt:
        await rt.receive()
        await rt.send({**event, "event_id": "evt-9"})
        error = (await receive_until(rt, "error"))[-1]["error"]
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt-9")


async def test_short_sessions_are_no_stage_failures(server: Server) -> None:
    for _ in range(10):
        async with open_realtime(server.ws_url) as rt:
            await rt.receive()
            vad = {"type": "server_vad", "silence_duration_ms": 300}  # restarts turn detection
            await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
            await trio.sleep(0.2)
    await trio.sleep(1)  # the server aborts each ASR session just after its socket closed
    metrics = (await trio.to_thread.run_sync(httpx.get, f"{server.url}/metrics")).text
    failures = [line for line in metrics.splitlines() if line.startswith("omnitrio_stage_failures_total{")]
    assert failures == []
