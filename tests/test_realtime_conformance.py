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
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
import trio_websocket

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.realtime.pacing import DEFAULT_LEAD, PIECE_SECONDS
from tests.pipelines import settled_server
from tests.realtime_events import GA_AUDIO_RESPONSE, checked_until, output_audio
from tests.realtime_sdk_types import checked
from tests.test_speech_roundtrip import heard_as

pytest.importorskip("piper", reason="the speech extra is not installed")

ROOT = Path(__file__).resolve().parent.parent
RATE = 24_000
SENTENCE = "Turn left at the second traffic light."
THREE = "The train leaves at nine. The library closes at ten tonight. We need more chairs."
DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta"}

pytestmark = pytest.mark.timeout(600)  # its server loads the speech pipeline: past the global 120 s when busy


class Server:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/realtime"

    def speech(self, text: str, silence_after: float = 0.0) -> bytes:
        """``text`` spoken by the server's voice, 24 kHz PCM16, with 0.2 s of silence before."""
        body = {"model": "omnitrio-speech", "input": text, "voice": "default", "response_format": "pcm"}
        pcm = httpx.post(f"{self.url}/v1/audio/speech", json=body, timeout=60).content
        return bytes(2 * RATE // 5) + pcm + bytes(2 * int(silence_after * RATE))


@contextmanager
def served(*args: str) -> Iterator[Server]:
    """``python -m omnitrio serve --port 0 ARGS`` on a free port, as a user starts it (and stops it: SIGINT)."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "omnitrio", "serve", "--port", "0", *args],
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


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The default pipeline with the "repeat" responder, which says the user's words back."""
    with served("--set", "responder.factory.mode=repeat") as started:
        yield started


def sdk_session(server: Server, steps: Any) -> list[dict[str, Any]]:
    """Run ``steps(connection, until)`` with the openai SDK's realtime client (in a thread)."""
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


def sdk_manual_say(connection: Any, until: Any, text: str) -> str:
    """With the SDK: turn server VAD off, add a user text message; returns its item id."""
    connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    until("session.updated")
    content = [{"type": "input_text", "text": text}]
    connection.conversation.item.create(item={"type": "message", "role": "user", "content": content})
    return str(until("conversation.item.done")[-1]["item"]["id"])


async def test_sdk_text_in_gets_the_ga_sequence_and_speech(server: Server) -> None:
    def steps(connection: Any, until: Any) -> None:
        sdk_manual_say(connection, until, SENTENCE)
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
    assert len(output_audio(events)) > RATE  # more than half a second of speech


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
        events = await checked_until(rt, "response.done")
        await rt.send({"type": "input_audio_buffer.clear"})
        events += await checked_until(rt, "input_audio_buffer.cleared")
    types = [e["type"] for e in events]
    # Server VAD may see the speech before the commit arrives; once committed, that audio starts no turn.
    after_commit = types[types.index("input_audio_buffer.committed") :]
    assert not [t for t in after_commit if t.startswith("input_audio_buffer.speech")]
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
        events = await checked_until(rt, "response.done", beta=True)
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
    assert output_audio(events, "response.audio.delta")


async def text_turn(rt: RealtimeClient, text: str) -> None:
    content = [{"type": "input_text", "text": text}]
    await rt.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}})
    await rt.send({"type": "response.create"})


async def test_truncate_cuts_audio_and_transcript_to_what_was_heard(server: Server) -> None:
    async with open_realtime(server.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        await text_turn(rt, THREE)
        events = await checked_until(rt, "response.done")
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
        truncated = (await checked_until(rt, "conversation.item.truncated"))[-1]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await checked_until(rt, "conversation.item.retrieved"))[-1]["item"]
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
        await checked_until(rt, "response.output_audio.delta")
        first_audio = trio.current_time()
        for i in range(0, len(interruption), 4800):
            chunk = base64.b64encode(interruption[i : i + 4800]).decode()
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        events = await checked_until(rt, "input_audio_buffer.speech_started")
        held = (len(output_audio(events)) / 2 + 4800) / RATE - (trio.current_time() - first_audio)
        events += await checked_until(rt, "response.done")
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
    assert len(output_audio(events)) / 2 / RATE <= played[0] + DEFAULT_LEAD + 2 * PIECE_SECONDS
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
        error = (await checked_until(rt, "error"))[-1]["error"]
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt-9")


async def test_short_sessions_are_no_stage_failures(server: Server) -> None:
    for _ in range(10):
        async with open_realtime(server.ws_url) as rt:
            await rt.receive()
            vad = {"type": "server_vad", "silence_duration_ms": 300}  # restarts turn detection
            await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
            await checked_until(rt, "session.updated")
    await settled_server(server.url)  # the server aborts each ASR session just after its socket closed
    metrics = (await trio.to_thread.run_sync(httpx.get, f"{server.url}/metrics")).text
    failures = [line for line in metrics.splitlines() if line.startswith("omnitrio_stage_failures_total{")]
    assert failures == []


async def microphone(rt: RealtimeClient, queued: bytearray) -> None:
    """Stream the microphone in real time, 100 ms a chunk: what is ``queued``, silence when nothing is."""
    start = trio.current_time()
    for tick in itertools.count():
        await trio.sleep_until(start + 0.1 * tick)
        chunk = bytes(queued[:4800]).ljust(4800, b"\0")
        del queued[:4800]
        await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})


def played_out(events: list[dict[str, Any]], first_audio_at: float) -> float:
    """When a client playing from ``first_audio_at`` in real time finishes the audio of ``events``."""
    return first_audio_at + len(output_audio(events)) / 2 / RATE


async def receive_answer(rt: RealtimeClient) -> tuple[list[dict[str, Any]], float]:
    """A response's events up to ``response.done``, and when its audio has finished playing."""
    events = await checked_until(rt, "response.output_audio.delta")
    first_audio_at = trio.current_time()
    events += await checked_until(rt, "response.done")
    return events, played_out(events, first_audio_at)


async def test_idle_timeout_answers_a_silent_user_once_the_answer_has_played(server: Server) -> None:
    speech = await trio.to_thread.run_sync(server.speech, "Yes, please.")
    queued = bytearray()
    async with open_realtime(server.ws_url) as rt, trio.open_nursery() as nursery:
        await rt.receive()
        vad = {"type": "server_vad", "idle_timeout_ms": 5000}
        await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
        nursery.start_soon(microphone, rt, queued)
        await text_turn(rt, "Hello there.")
        greeting, first_end = await receive_answer(rt)
        await trio.sleep_until(first_end + 1.0)
        queued += speech  # the user answers within the timeout: a turn of their own
        spoken, second_end = await receive_answer(rt)
        idle = await checked_until(rt, "input_audio_buffer.timeout_triggered")
        fired_at = trio.current_time()
        idle += await checked_until(rt, "response.done")
        nursery.cancel_scope.cancel()
    assert "input_audio_buffer.timeout_triggered" not in [e["type"] for e in greeting + spoken]
    # Counted from the end of playback (about 1.5 s after response.done here), not from response.done.
    assert fired_at >= second_end + 5.0 - 0.5
    triggered = next(e for e in idle if e["type"] == "input_audio_buffer.timeout_triggered")
    assert 4000 <= triggered["audio_end_ms"] - triggered["audio_start_ms"] <= 6000  # the silent span, as streamed
    after = [e["type"] for e in idle[idle.index(triggered) :] if e["type"] not in DELTAS]
    assert after[:4] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert after[4:] == GA_AUDIO_RESPONSE
    committed = idle[idle.index(triggered) + 1]
    assert committed["item_id"] == triggered["item_id"]
    assert idle[-1]["response"]["status"] == "completed"


async def test_sdk_out_of_band_response_with_its_own_input(server: Server) -> None:
    def steps(connection: Any, until: Any) -> None:
        added.append(sdk_manual_say(connection, until, SENTENCE))
        other = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "We need more chairs."}]}
        options = {"conversation": "none", "input": [other], "metadata": {"task": "check"}}
        connection.response.create(response={**options, "output_modalities": ["text"]})
        done.append(until("response.done")[-1]["response"])
        connection.conversation.item.retrieve(item_id=done[0]["output"][0]["id"])
        until("error")
        connection.response.create(response={"input": [{"type": "item_reference", "id": added[0]}]})
        done.append(until("response.done")[-1]["response"])

    added: list[str] = []
    done: list[dict[str, Any]] = []
    events = await in_thread(sdk_session, server, steps)
    out_of_band, referenced = done
    assert (out_of_band["conversation_id"], out_of_band["metadata"]) == (None, {"task": "check"})
    assert out_of_band["output"][0]["content"][0]["text"] == "We need more chairs."
    error = next(e for e in events if e["type"] == "error")["error"]
    assert error["code"] == "item_not_found"
    assert referenced["output"][0]["content"][0]["transcript"] == SENTENCE
    items = [e["item"]["id"] for e in events if e["type"].startswith("conversation.item") and "item" in e]
    assert out_of_band["output"][0]["id"] not in items
