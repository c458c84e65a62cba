"""``response.create``'s own parameters against the toy pipeline: out-of-band responses, a response's own
``input``, ``instructions``, modalities and token limit, and the errors that name a bad one."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from omnitrio.client import open_realtime
from tests.fake_pipeline import Served, start_server
from tests.test_serve_realtime import (
    DELTAS,
    chats,
    manual_turns,
    say,
)


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


def response_events(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if e["type"] not in DELTAS]


async def test_an_out_of_band_response_is_never_added_to_the_conversation(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "hello")
        options = {"conversation": "none", "output_modalities": ["text"], "metadata": {"purpose": "summary"}}
        await rt.send({"type": "response.create", "response": options})
        events = await rt.receive_until("response.done")
        item_id = events[-1]["response"]["output"][0]["id"]
        await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
        error = (await rt.receive_until("error"))[-1]["error"]
        await say(rt, "again")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    created, done = events[0]["response"], events[-1]["response"]
    assert response_events(events) == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert created["conversation_id"] is None and done["conversation_id"] is None
    assert created["metadata"] == done["metadata"] == {"purpose": "summary"}
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "echo: hello "}]
    assert (error["code"], error["param"]) == ("item_not_found", "item_id")
    out_of_band, later = chats(served)
    assert out_of_band.inputs["session_id"] is None  # the responder's kept conversation is left alone
    assert [m["content"] for m in later.inputs["messages"]] == ["hello", "again"]
    assert later.inputs["session_id"].startswith("sess-")


async def test_response_input_replaces_the_conversation_for_that_response(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        first = await say(rt, "one")
        await say(rt, "two")
        new = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "three"}]}
        context = [{"type": "item_reference", "id": first["item"]["id"]}, new]
        await rt.send({"type": "response.create", "response": {"input": context}})
        events = await rt.receive_until("response.done")
        await rt.send({"type": "response.create", "response": {"input": []}})
        await rt.receive_until("response.done")
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.done")
    with_input, empty, own = chats(served)
    assert with_input.inputs["messages"] == [{"role": "user", "content": "one"}, {"role": "user", "content": "three"}]
    assert with_input.inputs["session_id"] is None
    assert empty.inputs["messages"] == []
    assert events[-1]["response"]["conversation_id"].startswith("conv-")  # "auto": the answer joins the conversation
    said = [(m["role"], m["content"]) for m in own.inputs["messages"]]
    assert said[:3] == [("user", "one"), ("user", "two"), ("assistant", "echo: three")]  # "three" was not added


async def test_response_instructions_modalities_and_max_tokens_apply_to_that_response_only(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, instructions="be brief")
        await say(rt, "hi")
        options = {"instructions": "be loud", "output_modalities": ["text"], "max_output_tokens": 7}
        await rt.send({"type": "response.create", "response": options})
        done = (await rt.receive_until("response.done"))[-1]["response"]
        await rt.send({"type": "response.create"})
        default = (await rt.receive_until("response.done"))[-1]["response"]
    special, plain = chats(served)
    assert special.inputs["messages"][0] == {"role": "system", "content": "be loud"}
    assert (special.inputs["max_tokens"], special.inputs["modalities"]) == (7, ["text"])
    assert (done["max_output_tokens"], done["output_modalities"]) == (7, ["text"])
    assert plain.inputs["messages"][0] == {"role": "system", "content": "be brief"}
    assert (plain.inputs["max_tokens"], default["output_modalities"], default["metadata"]) == (None, ["audio"], None)


@pytest.mark.parametrize(
    ("options", "code", "param"),
    [
        ("fast", "invalid_value", "response"),
        ({"conversation": "conv-other"}, "invalid_value", "response.conversation"),
        ({"input": "one"}, "invalid_value", "response.input"),
        ({"input": [{"type": "item_reference", "id": "item-nope"}]}, "item_not_found", "response.input[0].id"),
        ({"input": [{"type": "message", "role": "robot"}]}, "invalid_value", "response.input[0].role"),
        ({"metadata": {"key": 5}}, "invalid_value", "response.metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "response.metadata"),
        ({"output_modalities": ["video"]}, "invalid_value", "response.output_modalities"),
        ({"max_output_tokens": 0}, "invalid_value", "response.max_output_tokens"),
        ({"audio": {"output": {"voice": "bob"}}}, "invalid_voice", "response.audio.output.voice"),
    ],
)
async def test_a_bad_response_parameter_is_an_error_naming_it(
    served: Served, options: Any, code: str, param: str
) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "hi")
        await rt.send({"type": "response.create", "event_id": "evt-2", "response": options})
        error = (await rt.receive_until("error"))[-1]["error"]
        await rt.send({"type": "response.create"})
        assert (await rt.receive_until("response.done"))[-1]["response"]["status"] == "completed"
    assert (error["code"], error["param"], error["event_id"]) == (code, param, "evt-2")
    assert len(chats(served)) == 1  # the refused response never reached the pipeline
