"""``WS /v1/realtime`` against the toy pipeline: the GA and beta protocols event by event.

The toy pipeline answers a chat with ``echo:`` and the last message's words (0.1 s of tone per word,
with its transcript), and a transcription with ``heard N.NN seconds``; it records every request.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest
import trio
import trio.testing
import trio_websocket

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.audio import float_to_pcm16
from omnitrio.serve.limits import ServeLimits
from omnitrio.serve.realtime.conversation import Spoken, heard_text
from omnitrio.serve.realtime.pacing import DEFAULT_LEAD, PIECE_SECONDS
from tests.fake_pipeline import FakeRequest, Served, start_server, tone
from tests.realtime_events import DELTAS, GA_AUDIO_RESPONSE


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


def one_second_b64() -> str:
    return base64.b64encode(float_to_pcm16(tone(1.0, 24_000, as_float=True))).decode()


def chats(served: Served) -> list[FakeRequest]:
    """The responder requests the server made, in order."""
    return [request for request in served.fake.history if request.inputs["task"] == "chat"]


async def manual_turns(rt: RealtimeClient, **session: Any) -> None:
    """Take ``session.created``, then turn server VAD off: the client commits and asks for responses."""
    await rt.receive()
    await rt.send({"type": "session.update", "session": {"turn_detection": None, **session}})
    await rt.receive_until("session.updated")


async def commit_one_second(rt: RealtimeClient) -> list[dict[str, Any]]:
    await rt.send({"type": "input_audio_buffer.append", "audio": one_second_b64()})
    await rt.send({"type": "input_audio_buffer.commit"})
    return await rt.receive_until("conversation.item.done")


async def say(rt: RealtimeClient, text: str, previous_item_id: str | None = None) -> dict[str, Any]:
    """Add a user text message; returns its ``conversation.item.added`` event."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await rt.send({"type": "conversation.item.create", "item": item, "previous_item_id": previous_item_id})
    events = await rt.receive_until("conversation.item.done")
    return next(e for e in events if e["type"] == "conversation.item.added")


@asynccontextmanager
async def open_beta(url: str) -> AsyncIterator[RealtimeClient]:
    headers = [("OpenAI-Beta", "realtime=v1")]
    async with trio_websocket.open_websocket_url(url, extra_headers=headers, message_queue_size=64) as connection:
        yield RealtimeClient(connection)


async def test_connect_sends_session_created_in_the_ga_shape(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        event = await rt.receive()
    session = event["session"]
    assert event["type"] == "session.created"
    assert session["type"] == "realtime" and session["output_modalities"] == ["audio"]
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"


async def test_semantic_vad_reads_back_with_its_eagerness(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        vad = {"type": "semantic_vad", "eagerness": "high", "create_response": False}
        await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
        session = (await rt.receive_until("session.updated"))[-1]["session"]
    detection = session["audio"]["input"]["turn_detection"]
    assert (detection["type"], detection["eagerness"]) == ("semantic_vad", "high")
    assert detection["create_response"] is False and detection["interrupt_response"] is True


@pytest.mark.parametrize(
    ("update", "param"),
    [
        ({"turn_detection": {"type": "push_to_talk"}}, "session.turn_detection.type"),
        ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "session.turn_detection.eagerness"),
        ({"output_modalities": ["video"]}, "session.output_modalities"),
        ({"max_output_tokens": 0}, "session.max_output_tokens"),
        ({"audio": {"output": {"speed": 9}}}, "session.audio.output.speed"),
        ({"audio": {"input": {"format": {"type": "audio/flac"}}}}, "session.audio.input.format"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 1000}}}},
            "session.audio.input.turn_detection.idle_timeout_ms",
        ),
        ({"turn_detection": {"idle_timeout_ms": 30_001}}, "session.turn_detection.idle_timeout_ms"),
        ({"audio": {"output": {"voice": "bob"}}}, "session.audio.output.voice"),
    ],
)
async def test_an_unsupported_session_value_is_an_error_naming_its_param(
    served: Served, update: dict[str, Any], param: str
) -> None:
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "event_id": "mine", "session": update})
        error = (await rt.receive_until("error"))[-1]["error"]
        if error["event_id"] is None:  # the toy pipeline has no ASR session for server VAD: it says so first
            error = (await rt.receive_until("error"))[-1]["error"]
    assert (error["param"], error["event_id"], error["type"]) == (param, "mine", "invalid_request_error")


async def test_session_update_passes_instructions_and_max_tokens_to_the_responder(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, instructions="be brief", max_output_tokens=40)
        await say(rt, "hello there")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    inputs = chats(served)[0].inputs
    assert inputs["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    assert inputs["max_tokens"] == 40
    assert inputs["session_id"].startswith("sess-")


async def test_a_response_is_the_ga_event_sequence_each_event_once(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "turn left")
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done")
    types = [e["type"] for e in events]
    assert [t for t in types if t not in DELTAS] == GA_AUDIO_RESPONSE
    assert len({e["event_id"] for e in events}) == len(events)
    assert not [t for t in types if t.startswith(("response.audio", "response.text"))]
    pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(pcm) == 3 * 2400 * 2  # three words, 0.1 s each at 24 kHz
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": "echo: turn left "}]
    assert done["usage"]["output_tokens"] == 3


async def test_a_text_only_session_gets_output_text_events(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, output_modalities=["text"])
        await say(rt, "hi")
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done")
    types = [e["type"] for e in events]
    assert "response.output_audio.delta" not in types
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "echo: hi "
    part = next(e for e in events if e["type"] == "response.content_part.done")["part"]
    assert part == {"type": "text", "text": "echo: hi "}
    assert chats(served)[0].inputs["modalities"] == ["text"]


async def test_a_beta_client_gets_beta_names_only(served: Served) -> None:
    async with open_beta(served.ws_url) as rt:
        created = await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        await rt.receive_until("session.updated")
        await say_beta(rt, "hi")
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done")
    types = [e["type"] for e in events]
    assert created["session"]["modalities"] == ["text", "audio"]
    assert created["session"]["input_audio_format"] == "pcm16"
    for name in (
        "response.audio.delta",
        "response.audio.done",
        "response.audio_transcript.done",
        "conversation.item.created",
    ):
        assert types.count(name) == (types.count(name) if name.endswith("delta") else 1), name
        assert name in types
    assert not [t for t in types if t.startswith("response.output_audio") or t.startswith("conversation.item.added")]
    assert "conversation.item.done" not in types
    assert events[-1]["response"]["output"][0]["content"][0]["type"] == "audio"


async def say_beta(rt: RealtimeClient, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await rt.send({"type": "conversation.item.create", "item": item})
    await rt.receive_until("conversation.item.created")


async def test_committed_audio_becomes_a_user_item_transcribed_for_the_responder(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        events = await commit_one_second(rt)
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    committed, added, done = events[-3:]
    assert committed["type"] == "input_audio_buffer.committed"
    assert added["item"]["id"] == committed["item_id"] == done["item"]["id"]
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    transcription = next(r for r in served.fake.history if r.inputs["task"] == "transcription")
    assert (transcription.inputs["audio"].dtype, transcription.inputs["audio"].shape) == (np.float32, (16_000,))
    assert chats(served)[0].inputs["messages"] == [{"role": "user", "content": "heard 1.00 seconds"}]


async def test_input_transcription_events_follow_the_item_when_asked(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, audio={"input": {"transcription": {"model": "whisper-1"}}})
        events = await commit_one_second(rt)
        events += await rt.receive_until("conversation.item.input_audio_transcription.completed")
    types = [e["type"] for e in events]
    assert types.index("conversation.item.added") < types.index("conversation.item.input_audio_transcription.delta")
    completed = events[-1]
    assert completed["transcript"] == "heard 1.00 seconds"
    assert completed["item_id"] == events[types.index("input_audio_buffer.committed")]["item_id"]
    assert completed["usage"] == {"type": "duration", "seconds": 1.0}


async def test_without_transcription_asked_no_transcription_event_is_sent(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await commit_one_second(rt)
        await say(rt, "after")
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done")
    assert not [e for e in events if e["type"].startswith("conversation.item.input_audio_transcription")]


async def test_items_are_placed_after_previous_item_id_and_the_responder_sees_that_order(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        first = await say(rt, "one")
        third = await say(rt, "three")
        second = await say(rt, "two", previous_item_id=first["item"]["id"])
        zeroth = await say(rt, "zero", previous_item_id="root")
        await rt.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        await rt.receive_until("response.done")
    assert third["previous_item_id"] == first["item"]["id"]
    assert second["previous_item_id"] == first["item"]["id"]
    assert zeroth["previous_item_id"] is None
    said = [m["content"] for m in chats(served)[0].inputs["messages"]]
    assert said == ["zero", "one", "two", "three"]


async def test_retrieve_returns_the_item_with_its_audio_and_delete_removes_it(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        item_id = (await commit_one_second(rt))[-1]["item"]["id"]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = (await rt.receive_until("conversation.item.retrieved"))[-1]["item"]
        await rt.send({"type": "conversation.item.delete", "item_id": item_id})
        deleted = (await rt.receive_until("conversation.item.deleted"))[-1]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        error = (await rt.receive_until("error"))[-1]["error"]
        await say(rt, "only this")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    assert len(base64.b64decode(retrieved["content"][0]["audio"])) == 2 * 24_000
    assert deleted["item_id"] == item_id
    assert (error["code"], error["param"]) == ("item_not_found", "item_id")
    assert chats(served)[0].inputs["messages"] == [{"role": "user", "content": "only this"}]


async def test_function_call_items_reach_the_responder_in_the_chat_shape(served: Served) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'}
    result = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        for item in (call, result):
            await rt.send({"type": "conversation.item.create", "item": item})
            await rt.receive_until("conversation.item.done")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    messages = chats(served)[0].inputs["messages"]
    called = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    assert messages[0] == {"role": "assistant", "content": "", "tool_calls": [called]}
    assert messages[1] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


async def test_a_later_response_sees_the_earlier_answer(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "hello")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
        await say(rt, "again")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    said = [(m["role"], m["content"]) for m in chats(served)[1].inputs["messages"]]
    assert said == [("user", "hello"), ("assistant", "echo: hello"), ("user", "again")]


async def long_reply(rt: RealtimeClient) -> float:
    """Ask for a long answer (the toy's ``slow``: 40 s of audio over 2 s); when its first audio came."""
    await manual_turns(rt)
    await say(rt, "slow")
    await rt.send({"type": "response.create"})
    await rt.receive_until("response.output_audio.delta")
    return trio.current_time()


async def test_response_cancel_leaves_the_client_at_most_the_lead_of_audio(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        first = await long_reply(rt)
        await trio.sleep(0.5)  # unpaced, the toy would have sent 10 s of audio by now
        await rt.send({"type": "response.cancel"})
        events = await rt.receive_until("response.done")
        played = trio.current_time() - first
    audio = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.output_audio.delta")
    assert audio / 2 / 24_000 <= played + DEFAULT_LEAD + 2 * PIECE_SECONDS  # of the 40 s the answer has
    types = [e["type"] for e in events]
    assert [t for t in types if t not in DELTAS][-6:] == GA_AUDIO_RESPONSE[-6:]
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert chats(served)[0].outcome == "aborted"


async def test_an_interrupted_response_is_measured_in_metrics(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await long_reply(rt)
        await rt.send({"type": "response.cancel"})
        await rt.receive_until("response.done")
        await served.fake.idle()  # the cancelled request is released
        await trio.testing.wait_all_tasks_blocked()  # and the server has measured it
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{served.url}/metrics")).text
    for name in ("interrupt_to_last_audio", "interrupt_to_released", "unplayed_audio_at_interrupt"):
        assert f"omnitrio_realtime_{name}_seconds_count 1.0" in text, name
    assert "omnitrio_realtime_time_to_first_audio_seconds_count 1.0" in text


async def test_second_response_create_while_one_runs_is_an_error(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await long_reply(rt)
        await rt.send({"type": "response.create"})
        error = (await rt.receive_until("error"))[-1]
    assert error["error"]["code"] == "conversation_already_has_active_response"


async def test_closing_the_socket_aborts_the_response(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await long_reply(rt)
    request = chats(served)[0]
    with trio.fail_after(2):
        await request.exited.wait()
    assert request.outcome == "aborted"


async def test_failed_response_reports_failed_and_keeps_the_session(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "fail")
        await rt.send({"type": "response.create"})
        done = (await rt.receive_until("response.done"))[-1]
        await rt.send({"type": "input_audio_buffer.clear"})
        assert (await rt.receive_until("input_audio_buffer.cleared"))[-1]["type"] == "input_audio_buffer.cleared"
    assert done["response"]["status"] == "failed"
    assert "fake failure on purpose" in done["response"]["status_details"]["error"]["message"]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "response.dance"}, "unknown_event", "type"),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_base64", "audio"),
        (
            {"type": "conversation.item.create", "item": {"type": "message", "role": "robot"}},
            "invalid_value",
            "item.role",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": []}},
            "invalid_value",
            "item.content",
        ),
        ({"type": "conversation.item.delete", "item_id": "item-nope"}, "item_not_found", "item_id"),
        (
            {"type": "conversation.item.truncate", "item_id": "item-nope", "content_index": 0, "audio_end_ms": 5},
            "item_not_found",
            "item_id",
        ),
        (
            {
                "type": "conversation.item.create",
                "previous_item_id": "item-nope",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
            },
            "item_not_found",
            "previous_item_id",
        ),
        ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
        ({"type": "response.cancel"}, "response_cancel_not_active", None),
    ],
)
async def test_a_bad_client_event_is_an_error_event_and_the_session_goes_on(
    served: Served, event: dict[str, Any], code: str, param: str | None
) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({**event, "event_id": "evt-1"})
        error = (await rt.receive_until("error"))[-1]["error"]
        await say(rt, "still here")
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt-1")


async def test_an_append_past_the_input_limit_is_refused(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, limits=ServeLimits(max_audio_seconds=0.8))
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "input_audio_buffer.append", "audio": one_second_b64()})
        error = (await rt.receive_until("error"))[-1]["error"]
        await rt.send({"type": "input_audio_buffer.commit"})
        empty = (await rt.receive_until("error"))[-1]["error"]
    assert (error["code"], error["param"]) == ("input_audio_buffer_full", "audio")
    assert empty["code"] == "input_audio_buffer_commit_empty"  # the refused audio was not kept


async def test_the_audio_lead_is_a_server_option(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, realtime_audio_lead=0.4)
    async with open_realtime(served.ws_url) as rt:
        first = await long_reply(rt)
        await rt.send({"type": "response.cancel"})
        events = await rt.receive_until("response.done")
        played = trio.current_time() - first
    audio = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.output_audio.delta")
    assert audio / 2 / 24_000 <= played + 0.4 + 2 * PIECE_SECONDS


async def test_the_session_speed_reaches_the_pipeline(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, audio={"output": {"speed": 1.25}})
        await say(rt, "hi")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    assert chats(served)[0].inputs["speed"] == 1.25


def test_heard_text_is_whole_sentences_then_a_proportional_cut_at_a_word() -> None:
    spoken = [Spoken("One two three.", 0, 1000), Spoken(" Four five six seven.", 1000, 2000)]
    assert heard_text(spoken, 1000) == "One two three."
    assert heard_text(spoken, 1000 + 2000 * 11 // 20) == "One two three. Four five"
    assert heard_text(spoken, 500) == "One two"  # 7 of 14 characters end at a word boundary
    assert heard_text(spoken, 400) == "One"
    assert heard_text(spoken, 3000) == "One two three. Four five six seven."


async def test_an_input_audio_item_is_transcribed_for_the_responder(served: Served) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": one_second_b64()}]}
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "conversation.item.create", "item": item})
        added = (await rt.receive_until("conversation.item.added"))[-1]
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    assert chats(served)[0].inputs["messages"] == [{"role": "user", "content": "heard 1.00 seconds"}]


async def test_a_truncated_answer_gets_no_more_audio_and_is_cancelled(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await long_reply(rt)
        events = await rt.receive_until("response.output_audio.delta")
        item_id = events[-1]["item_id"]
        await rt.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 0})
        after = await rt.receive_until("response.done")
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        retrieved = (await rt.receive_until("conversation.item.retrieved"))[-1]["item"]
    truncated = [e["type"] for e in after].index("conversation.item.truncated")
    assert "response.output_audio.delta" not in [e["type"] for e in after[truncated:]]
    assert after[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert "audio" not in retrieved["content"][0]  # cut at 0 ms, and nothing added since
