"""What client libraries send and expect beyond the API reference's examples, on the toy pipeline.

Optional fields sent as ``null`` are "not given", as clients that serialise every field send them
(LiveKit's ``generate_reply`` sends ``"instructions": null``); where null is a value (turn detection
off), it keeps that meaning. A ``response.cancel`` that loses the race with the server's own
cancel gets OpenAI's error wording, which LiveKit recognises.
"""

from __future__ import annotations

import pytest
import trio

from omnitrio.client import open_realtime
from omnitrio.serve.realtime.protocol import wanted
from tests.fake_pipeline import Served, start_server
from tests.test_serve_realtime import chats, manual_turns, say

RESPONSE_FIELDS = "instructions output_modalities max_output_tokens conversation audio metadata input tools tool_choice"
UNSET_RESPONSE = dict.fromkeys(f"{RESPONSE_FIELDS} prompt voice modalities max_response_output_tokens".split())


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def test_a_response_create_with_null_fields_answers_as_the_session_says(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, instructions="be kind", output_modalities=["text"])
        await say(rt, "hello")
        await rt.send({"type": "response.create", "response": UNSET_RESPONSE})
        events = await rt.receive_until("response.done")
    assert not [e for e in events if e["type"] == "error"]
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["conversation_id"] is not None
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "echo: hello "}]
    assert chats(served)[0].inputs["messages"][0] == {"role": "system", "content": "be kind"}


async def test_a_null_audio_output_field_of_a_response_is_not_given(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "hello")
        audio = {"output": {"voice": None, "format": None, "speed": None}}
        await rt.send({"type": "response.create", "response": {"audio": audio}})
        events = await rt.receive_until("response.done")
    assert not [e for e in events if e["type"] == "error"]
    assert events[-1]["response"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24_000}


async def test_a_session_update_with_null_fields_keeps_what_was_set(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, instructions="be kind", max_output_tokens=200, output_modalities=["text"])
        unset = dict.fromkeys(["instructions", "tools", "tool_choice", "max_output_tokens", "output_modalities"])
        audio = {"input": {"format": None}, "output": {"voice": None, "speed": None, "format": None}}
        await rt.send({"type": "session.update", "session": {**unset, "audio": audio}})
        events = await rt.receive_until("session.updated")
    assert not [e for e in events if e["type"] == "error"]
    session = events[-1]["session"]
    assert (session["instructions"], session["max_output_tokens"]) == ("be kind", 200)
    assert (session["output_modalities"], session["tools"], session["tool_choice"]) == (["text"], [], "auto")
    assert session["audio"]["output"]["speed"] == 1.0
    assert session["audio"]["input"]["turn_detection"] is None  # null that means "off" still does


async def test_null_turn_detection_still_turns_server_vad_off(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
        session = (await rt.receive_until("session.updated"))[-1]["session"]
    assert session["audio"]["input"]["turn_detection"] is None


async def test_a_cancel_with_no_response_in_progress_gets_openais_wording(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await rt.send({"type": "response.cancel"})
        error = (await rt.receive_until("error"))[-1]["error"]
    assert error["code"] == "response_cancel_not_active"
    assert error["message"].startswith("Cancellation failed")  # LiveKit ignores this one by its words


def test_omnitrio_events_go_only_to_a_session_that_asked_for_them() -> None:
    paused = {"type": "omnitrio.output_audio_buffer.paused", "response_id": "resp-1"}
    assert not wanted(paused, {"omnitrio_events": False}) and not wanted(paused, {})
    assert wanted(paused, {"omnitrio_events": True})
    assert wanted({"type": "response.done"}, {})


async def test_a_session_asks_for_omnitrio_events_with_true_or_false_only(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        default = (await rt.receive_until("session.updated"))[-1]["session"]
        await rt.send({"type": "session.update", "session": {"omnitrio_events": "yes"}})
        error = (await rt.receive_until("error"))[-1]["error"]
        await rt.send({"type": "session.update", "session": {"omnitrio_events": True}})
        session = (await rt.receive_until("session.updated"))[-1]["session"]
    assert "omnitrio_events" not in default  # a default session is OpenAI's shape only
    assert error["param"] == "session.omnitrio_events"
    assert session["omnitrio_events"] is True
