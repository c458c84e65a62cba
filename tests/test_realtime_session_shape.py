"""What a realtime session looks like to an OpenAI SDK, against the toy pipeline: the voice it reads back
and refuses to change once spoken, and every event sent checked against the SDK's type of its name."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.realtime.protocol import BETA_NAMES
from tests.fake_pipeline import Served, start_server
from tests.realtime_sdk_types import checked
from tests.test_serve_realtime import (
    DELTAS,
    GA_AUDIO_RESPONSE,
    chats,
    manual_turns,
    one_second_b64,
    open_beta,
    say,
)


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def test_every_voice_name_plays_the_one_voice_and_the_session_says_so(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}})
        session = (await rt.receive_until("session.updated"))[-1]["session"]
    assert session["audio"]["output"]["voice"] == "default"
    assert "voice" not in session and "turn_detection" not in session  # beta spellings go to beta clients only


async def test_a_voice_change_once_the_assistant_has_spoken_is_refused_whole(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, audio={"output": {"voice": "alloy"}})
        await say(rt, "hi")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
        change = {"instructions": "be loud", "audio": {"output": {"voice": "echo"}}}
        await rt.send({"type": "session.update", "session": change})
        error = (await rt.receive_until("error"))[-1]["error"]
        await rt.send({"type": "session.update", "session": {"voice": "alloy", "instructions": "be kind"}})
        await rt.receive_until("session.updated")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    assert (error["code"], error["param"]) == ("cannot_update_voice", "session.audio.output.voice")
    assert chats(served)[1].inputs["messages"][0] == {"role": "system", "content": "be kind"}


async def every_kind_of_event(rt: RealtimeClient, *, beta: bool) -> list[dict[str, Any]]:
    """Drive one session through every server event the toy pipeline can cause; all events received."""
    events = [await rt.receive(), await rt.receive()]

    async def step(event: dict[str, Any], until: str) -> None:
        await rt.send(event)
        events.extend(await rt.receive_until(until))

    manual: dict[str, Any] = {"turn_detection": None, "input_audio_transcription": {}}
    await step({"type": "session.update", "session": manual}, "session.updated")
    await rt.send({"type": "input_audio_buffer.append", "audio": one_second_b64()})
    await step({"type": "input_audio_buffer.commit"}, "conversation.item.input_audio_transcription.completed")
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "turn left"}]}
    await step(
        {"type": "conversation.item.create", "item": item},
        "conversation.item.done" if not beta else "conversation.item.created",
    )
    await step({"type": "response.create"}, "response.done")
    text_only = {"modalities": ["text"]} if beta else {"output_modalities": ["text"]}
    await step({"type": "response.create", "response": text_only}, "response.done")
    await step({"type": "input_audio_buffer.clear"}, "input_audio_buffer.cleared")
    await step({"type": "conversation.item.delete", "item_id": "item-nope"}, "error")
    spoken = next(e for e in events if e["type"] == "response.done")["response"]["output"][0]["id"]
    cut = {"item_id": spoken, "content_index": 0, "audio_end_ms": 100}
    await step({"type": "conversation.item.truncate", **cut}, "conversation.item.truncated")
    await step({"type": "conversation.item.retrieve", "item_id": spoken}, "conversation.item.retrieved")
    await step({"type": "conversation.item.delete", "item_id": spoken}, "conversation.item.deleted")
    item["content"] = [{"type": "input_text", "text": "slow"}]
    await step(
        {"type": "conversation.item.create", "item": item},
        "conversation.item.done" if not beta else "conversation.item.created",
    )
    await step({"type": "response.create"}, "response.audio.delta" if beta else "response.output_audio.delta")
    await step({"type": "response.cancel"}, "response.done")
    return events


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_every_event_sent_is_the_sdk_type_of_its_name_with_no_field_it_lacks(served: Served, beta: bool) -> None:
    async with open_beta(served.ws_url) if beta else open_realtime(served.ws_url) as rt:
        events = await every_kind_of_event(rt, beta=beta)
    for event in events:
        checked(event, beta=beta)
    kinds = {e["type"] for e in events}
    expected = {
        *GA_AUDIO_RESPONSE,
        *DELTAS,
        "response.output_text.done",
        "session.created",
        "conversation.created",
        "session.updated",
        "error",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.truncated",
        "conversation.item.retrieved",
        "conversation.item.deleted",
    }
    if beta:
        expected = {BETA_NAMES.get(kind, kind) for kind in expected - {"conversation.item.done"}}
    assert kinds == expected
