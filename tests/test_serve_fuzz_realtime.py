"""A fuzzed realtime surface: generated malformed client events, broken frames, out-of-order and rude clients.

Each malformed event is answered with an ``error`` event (or applied, when it happens to be valid),
the socket stays open and keeps answering, the server logs no unexpected error, and once the
client has gone no pipeline request is left and its session's admission place is free again.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
import trio_websocket
import wsproto
import wsproto.events

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.audio import float_to_pcm16
from omnitrio.serve.limits import ServeLimits
from tests.fake_pipeline import FakePipeline, FakeRequest, Served, start_server, tone
from tests.test_serve_fuzz_http import WRONG
from tests.test_serve_realtime import manual_turns

AUDIO = base64.b64encode(float_to_pcm16(tone(0.1, 24_000, as_float=True))).decode()
PCM = {"type": "audio/pcm", "rate": 24_000}
SESSION = {
    "type": "realtime",
    "instructions": "be brief",
    "voice": "default",
    "output_modalities": ["audio"],
    "modalities": ["audio", "text"],
    "turn_detection": None,
    "input_audio_format": "pcm16",
    "output_audio_format": "pcm16",
    "audio": {"input": {"format": PCM, "turn_detection": None}, "output": {"format": PCM, "voice": "default"}},
    "tools": [],
    "tool_choice": "auto",
    "max_output_tokens": "inf",
}
VALID: dict[str, dict[str, Any]] = {
    "session.update": {"session": SESSION},
    "input_audio_buffer.append": {"audio": AUDIO},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "response.create": {"response": {"instructions": "x", "output_modalities": ["audio"], "max_output_tokens": 5}},
    "response.cancel": {"response_id": "resp-none"},
    "conversation.item.create": {"item": {"type": "message", "role": "user", "content": []}},
    "conversation.item.truncate": {"item_id": "item-x", "content_index": 0, "audio_end_ms": 10},
    "conversation.item.delete": {"item_id": "item-x"},
    "output_audio_buffer.clear": {},
}


def mutations(kind: str, fields: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``kind``'s event with one field (or one field one level down) replaced by each wrong value."""
    yield {"type": kind, **fields}
    for wrong in WRONG:
        yield {"type": kind, **fields, "event_id": wrong}
    for name, good in fields.items():
        for wrong in WRONG:
            yield {"type": kind, **fields, name: wrong}
        if isinstance(good, dict):
            for inner in good:
                for wrong in WRONG:
                    yield {"type": kind, **fields, name: {**good, inner: wrong}}
    for audio in ("%%%", "AAA", "A" * 3 + "=", AUDIO[:-3], "\u00e9t\u00e9", " " + AUDIO):
        yield {"type": "input_audio_buffer.append", "audio": audio}


class ListeningFake(FakePipeline):
    """The fake pipeline with a streaming ASR session that never hears speech: server VAD runs, quietly."""

    def _reply(self, inputs: dict[str, Any]) -> list[str]:
        return ["listening"] if inputs["task"] == "asr_session" else super()._reply(inputs)


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, ListeningFake(), limits=ServeLimits(max_realtime_sessions=2))


@pytest.fixture(autouse=True)
def no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A case that raised inside the server (rather than answering) fails the test that sent it."""
    with caplog.at_level(logging.ERROR):
        yield
    errors = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    assert errors == []


async def answers_to(rt: RealtimeClient, event: Any, probe: str) -> list[dict[str, Any]]:
    """Send ``event`` (raw text or a dict), then a probe; every event up to the probe's ``error``."""
    await rt.connection.send_message(event if isinstance(event, str) else json.dumps(event))
    await rt.send({"type": "fuzz.probe", "event_id": probe})
    events = []
    with trio.fail_after(5):
        while True:
            events.append(await rt.receive())
            if events[-1]["type"] == "error" and events[-1]["error"].get("event_id") == probe:
                return events[:-1]


async def nothing_left(served: Served) -> None:
    """No pipeline request is live and both admission places are free again."""
    await served.fake.idle()
    with trio.fail_after(5):
        while True:  # the server gives a place back just after the socket closed
            async with open_realtime(served.ws_url) as one, open_realtime(served.ws_url) as two:
                kinds = {(await one.receive())["type"], (await two.receive())["type"]}
            if kinds == {"session.created"}:
                break
            await trio.testing.wait_all_tasks_blocked()
    await served.fake.idle()


@pytest.mark.parametrize("kind", sorted(VALID))
async def test_every_malformed_client_event_is_answered_and_the_socket_stays_usable(served: Served, kind: str) -> None:
    answered: list[str] = []
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        for i, event in enumerate(mutations(kind, VALID[kind])):
            events = await answers_to(rt, _json_safe(event), f"probe-{i}")
            answered += [e["type"] for e in events]
            if any(e["type"].startswith("response.") for e in events) or "response." in kind:
                await rt.send({"type": "response.cancel"})  # keep at most one response going
    await nothing_left(served)
    assert "error" in answered  # the corpus is not all valid events


def _json_safe(event: dict[str, Any]) -> str:
    return json.dumps(event)  # lone surrogates go out as escapes: the server must cope with them


@pytest.mark.parametrize(
    "frame",
    [
        "",
        "{",
        '{"type": "session.update", "session": {',
        "\x00",
        "null",
        "1e999",
        '"response.create"',
        "[" * 50_000 + "]" * 50_000,
        '{"type": "session.update", "session": ' + '{"a":' * 20_000 + "1" + "}" * 20_000 + "}",
        json.dumps({"type": "input_audio_buffer.append", "audio": AUDIO * 2000}),
        json.dumps({"type": "x" * 100_000}),
    ],
)
async def test_truncated_and_odd_json_frames_get_an_error_event(served: Served, frame: str) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        events = await answers_to(rt, frame, "probe")
    assert [e["type"] for e in events] in (["error"], [])  # an append of valid audio has no answer
    await nothing_left(served)


async def test_binary_frames_of_any_content_get_an_error_event(served: Served) -> None:
    rng = random.Random(21)
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        for i, size in enumerate((1, 7, 1024, 300_000)):
            await rt.connection.send_message(rng.randbytes(size))
            with trio.fail_after(5):
                event = await rt.receive()
            assert event["error"]["code"] == "invalid_frame", i
    await nothing_left(served)


@asynccontextmanager
async def raw_realtime(served: Served) -> AsyncIterator[tuple[trio.SocketStream, wsproto.WSConnection]]:
    """A realtime WebSocket spoken by hand over TCP (the handshake done), for frames no client library sends."""
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        await stream.send_all(client.send(wsproto.events.Request(host="127.0.0.1", target="/v1/realtime")))
        with trio.fail_after(5):
            while not any(isinstance(e, wsproto.events.AcceptConnection) for e in client.events()):
                client.receive_data(await stream.receive_some(65536) or None)
        yield stream, client


def masked_text_frame(payload: bytes) -> bytes:
    """One client text frame carrying ``payload`` as is (valid UTF-8 or not); payload under 126 bytes."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return struct.pack("!BB", 0x81, 0x80 | len(payload)) + mask + masked


async def test_a_text_frame_of_invalid_utf8_ends_the_connection_and_leaves_nothing(served: Served) -> None:
    async with raw_realtime(served) as (stream, client):
        await stream.send_all(masked_text_frame(b'{"type": "\xff\xfe"}'))
        closed = None
        with trio.fail_after(5):
            while closed is None:
                data = await stream.receive_some(65536)
                client.receive_data(data or None)
                closed = next((e for e in client.events() if isinstance(e, wsproto.events.CloseConnection)), None)
    assert closed.code in (1006, 1007)  # hypercorn drops the connection on a protocol error
    await nothing_left(served)


OUT_OF_ORDER: list[dict[str, Any]] = [
    {"type": "response.cancel"},
    {"type": "input_audio_buffer.commit"},
    {"type": "response.create"},
    {"type": "response.create"},
    {"type": "input_audio_buffer.append", "audio": AUDIO},
    {"type": "session.update", "session": {"turn_detection": {"type": "server_vad"}}},
    {"type": "input_audio_buffer.clear"},
    {"type": "response.cancel"},
    {"type": "response.cancel"},
    {"type": "session.update", "session": {"turn_detection": None}},
    {"type": "input_audio_buffer.commit"},
    {"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 1},
]


async def test_random_event_orders_never_break_the_session(served: Served) -> None:
    rng = random.Random(1013)
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        for i in range(150):
            await answers_to(rt, rng.choice(OUT_OF_ORDER), f"probe-{i}")
        await rt.send({"type": "response.cancel"})
    await nothing_left(served)


async def test_a_flood_of_events_sent_without_reading_is_survived(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        for _ in range(2000):
            await rt.send({"type": "input_audio_buffer.commit"})  # each answered with an error event
        events = await answers_to(rt, {"type": "input_audio_buffer.clear"}, "probe")
    assert events[-1]["type"] == "input_audio_buffer.cleared"
    await nothing_left(served)


async def response_request(served: Served) -> FakeRequest:
    """The next response the fake pipeline is asked for (not the ASR session's commands)."""
    while (request := await served.fake.arrivals.receive()).inputs["task"] == "asr_session":
        continue
    return request


async def test_a_client_that_stops_reading_mid_response_then_closes_aborts_it(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "session.update", "session": {"instructions": "slow"}})
        await rt.send({"type": "response.create"})
        request = await response_request(served)
        await trio.sleep(0.3)  # audio deltas pile up while nobody reads
    with trio.fail_after(5):
        await request.exited.wait()
    assert request.outcome == "aborted"
    await nothing_left(served)


async def test_a_client_whose_network_drops_mid_response_aborts_it(served: Served) -> None:
    async with raw_realtime(served) as (stream, client):
        for event in ({"type": "session.update", "session": {"instructions": "slow"}}, {"type": "response.create"}):
            await stream.send_all(client.send(wsproto.events.TextMessage(json.dumps(event))))
        request = await response_request(served)
        await trio.sleep(0.3)
    # the TCP connection is gone without a closing handshake
    with trio.fail_after(5):
        await request.exited.wait()
    assert request.outcome == "aborted"
    await nothing_left(served)


async def test_a_handshake_that_never_completes_leaves_nothing(served: Served) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        await stream.send_all(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n")
        await trio.testing.wait_all_tasks_blocked()  # the server has read it and waits for the rest
    with pytest.raises(trio_websocket.ConnectionRejected):
        async with trio_websocket.open_websocket_url(served.ws_url.replace("/v1/realtime", "/v1/realtimex")):
            pass
    await nothing_left(served)
