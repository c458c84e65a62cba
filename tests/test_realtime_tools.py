"""Function calling over ``WS /v1/realtime``, against a responder that calls the tool it is given.

The scripted responder (the toy pipeline, see ``tests/fake_pipeline.py``) answers a chat that
offers tools and ends with the user's words by calling the first tool with ``{"city": <last
word>}``; a chat that ends with the tool's output is answered as usual (``echo:`` and its words).
Every event is checked against the official SDK's type of its name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import pytest
import trio

from omnitrio.client import open_realtime
from omnitrio.messages import CompleteMessage, StreamMessage
from tests.fake_pipeline import FakePipeline, FakeRequest, Served, start_server
from tests.realtime_events import checked_until
from tests.test_serve_realtime import chats, manual_turns, say

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL_EVENTS = [
    "response.output_item.added",
    "conversation.item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "conversation.item.done",
]


class ToolCallingPipeline(FakePipeline):
    """The toy pipeline, whose responder calls the first tool it is offered for a user's words."""

    async def _messages(
        self, request: FakeRequest, words: list[str]
    ) -> AsyncGenerator[StreamMessage | CompleteMessage, None]:
        inputs = request.inputs
        if inputs["task"] == "chat" and inputs.get("tools") and inputs["messages"][-1]["role"] == "user":
            name = inputs["tools"][0]["function"]["name"]
            arguments = json.dumps({"city": words[-1].strip("?.")})
            call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
            request.outcome = "completed"
            yield CompleteMessage(
                request.request_id, "fake", {"text": "", "tool_calls": [call], "finish_reason": "tool_calls"}
            )
            return
        async for message in super()._messages(request, words):
            yield message


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, ToolCallingPipeline())


async def test_session_tools_reach_the_responder_in_the_chat_shape(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, tools=[WEATHER], tool_choice="required")
        await say(rt, "What is the weather in Oslo?")
        await rt.send({"type": "response.create"})
        await checked_until(rt, "response.done")
    inputs = chats(served)[0].inputs
    described = {key: WEATHER[key] for key in ("name", "description", "parameters")}
    assert inputs["tools"] == [{"type": "function", "function": described}]
    assert inputs["tool_choice"] == "required"


async def test_a_session_without_tools_offers_the_responder_none(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt)
        await say(rt, "What is the weather in Oslo?")
        await rt.send({"type": "response.create"})
        await checked_until(rt, "response.done")
    assert "tools" not in chats(served)[0].inputs


async def test_a_tool_call_is_a_function_call_item_with_its_arguments(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, tools=[WEATHER])
        await say(rt, "What is the weather in Oslo?")
        await rt.send({"type": "response.create"})
        events = await checked_until(rt, "response.done")
    types = [e["type"] for e in events]
    assert types == ["response.created", *CALL_EVENTS, "response.done"]  # no message item: the answer said nothing
    added, done = events[1]["item"], events[5]["item"]
    assert (added["type"], added["status"], added["name"], added["arguments"]) == (
        "function_call",
        "in_progress",
        "get_weather",
        "",
    )
    arguments = events[3]["delta"]
    assert json.loads(arguments) == {"city": "Oslo"} and events[4]["arguments"] == arguments
    assert events[4]["call_id"] == events[3]["call_id"] == done["call_id"] == "call_1"
    assert (done["status"], done["arguments"]) == ("completed", arguments)
    response = events[-1]["response"]
    assert response["status"] == "completed" and response["output"] == [done]


async def test_the_function_output_then_response_create_answers_with_the_result_in_view(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await manual_turns(rt, tools=[WEATHER])
        await say(rt, "What is the weather in Oslo?")
        await rt.send({"type": "response.create"})
        call = (await checked_until(rt, "response.done"))[-1]["response"]["output"][0]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"}
        await rt.send({"type": "conversation.item.create", "item": output})
        await checked_until(rt, "conversation.item.done")
        await rt.send({"type": "response.create"})
        events = await checked_until(rt, "response.done")
    assert events[-1]["response"]["status"] == "completed"
    assert "sunny" in events[-1]["response"]["output"][0]["content"][0]["transcript"]  # echo: the tool's output
    messages = chats(served)[1].inputs["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call["call_id"] == messages[2]["tool_call_id"]
    assert messages[2]["content"] == "sunny, 21 C"
