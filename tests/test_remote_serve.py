"""The default pipeline with its responder swapped (``--set``) for the user's own LLM server.

Against a scripted OpenAI-compatible server: chat tool calls in OpenAI's shape, a realtime
conversation's history, a spoken turn answered in speech, and barge-in closing the server's stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import openai
import pytest
import trio

from omnitrio import open_pipeline
from omnitrio.cli import DEFAULT_CONFIG
from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.config_loading import load
from omnitrio.serve import serve
from tests.chat_servers import Reply, scripted_server, text_chunks
from tests.test_realtime_voice import LONGER, SENTENCE, pcm16, send_audio, transcript
from toys.speech_text import heard_as

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def remote_responder(base_url: str, model: str = "scripted") -> list[str]:
    """The ``--set`` overrides that point the default pipeline's responder at ``base_url``."""
    return [
        "responder.factory_path=schedulers.speech.remote_responder.create_remote_responder_stage",
        f'responder.factory={{ base_url = "{base_url}", model = "{model}" }}',
    ]


@asynccontextmanager
async def served(overrides: Sequence[str]) -> AsyncIterator[int]:
    """The default pipeline with ``overrides`` behind a server on a free port; its port."""
    pytest.importorskip("piper", reason="the speech extra is not installed")
    async with open_pipeline(load(DEFAULT_CONFIG, overrides), inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            yield await nursery.start(partial(serve, pipeline, port=0, handle_signals=False, graceful_timeout=0.5))
            nursery.cancel_scope.cancel()


def tool_call_chunks() -> list[dict[str, Any]]:
    call = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
    return [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]


async def test_chat_tool_calls_come_back_in_openais_shape_whole_and_streamed() -> None:
    question: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    async with scripted_server(Reply(tool_call_chunks())) as server, served(remote_responder(server.base_url)) as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            whole = await api.chat.completions.create(model="omnitrio-speech", messages=question, tools=[WEATHER])
            stream = await api.chat.completions.create(
                model="omnitrio-speech", messages=question, tools=[WEATHER], tool_choice="required", stream=True
            )
            chunks = [chunk async for chunk in stream]
    assert server.bodies[0]["tools"] == [WEATHER] and server.bodies[1]["tool_choice"] == "required"
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.id, call.type, call.function.name) == ("call_7", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.index, c.id, c.function and c.function.name) for c in streamed] == [(0, "call_7", "get_weather")]
    assert streamed[0].function is not None and streamed[0].function.arguments == '{"city": "Oslo"}'
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"


async def test_a_spoken_answer_that_calls_a_tool_still_carries_the_call() -> None:
    """What the realtime layer reads as a function call: the spoken pipeline's result keeps the calls."""
    question: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    async with scripted_server(Reply(tool_call_chunks())) as server, served(remote_responder(server.base_url)) as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            spoken = await api.chat.completions.create(
                model="omnitrio-speech",
                messages=question,
                tools=[WEATHER],
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "wav"},
            )
    assert spoken.choices[0].finish_reason == "tool_calls"
    assert spoken.choices[0].message.tool_calls and spoken.choices[0].message.tool_calls[0].id == "call_7"


async def say(rt: RealtimeClient, text: str) -> list[dict[str, Any]]:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await rt.send({"type": "conversation.item.create", "item": item})
    await rt.send({"type": "response.create"})
    return await rt.receive_until("response.done")


async def test_a_realtime_conversation_reaches_the_server_with_its_history_and_is_spoken() -> None:
    replies = [Reply(text_chunks("Hello Alice. ", "Nice to meet you.")), Reply(text_chunks("Your name is Alice."))]
    async with scripted_server(*replies) as server, served(remote_responder(server.base_url)) as port:
        async with open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
            await rt.receive()
            await rt.send({"type": "session.update", "session": {"turn_detection": None}})
            first = await say(rt, "My name is Alice.")
            second = await say(rt, "What is my name?")
    for events in (first, second):
        assert events[-1]["response"]["status"] == "completed"
        assert [e for e in events if e["type"] == "response.output_audio.delta"]
    assert transcript(first) == "Hello Alice. Nice to meet you." and transcript(second) == "Your name is Alice."
    history = [(m["role"], m["content"]) for m in server.bodies[-1]["messages"] if m["role"] != "system"]
    assert history == [
        ("user", "My name is Alice."),
        ("assistant", "Hello Alice. Nice to meet you."),
        ("user", "What is my name?"),
    ]


async def test_a_spoken_turn_is_heard_by_the_server_and_its_answer_spoken() -> None:
    reply = Reply(text_chunks("Left at the second light. ", "Got it."))
    async with scripted_server(reply) as server, served(remote_responder(server.base_url)) as port:
        async with open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
            await rt.receive()
            await send_audio(rt, pcm16(SENTENCE, silence_after=1.0))
            events = await rt.receive_until("response.done", timeout=120)
    assert events[-1]["response"]["status"] == "completed"
    assert transcript(events) == "Left at the second light. Got it."
    asked = server.bodies[-1]["messages"][-1]
    assert asked["role"] == "user" and heard_as(asked["content"], SENTENCE), asked


async def test_speaking_over_a_remote_answer_cancels_it_and_closes_the_servers_stream() -> None:
    reply = Reply(text_chunks("Here is the first sentence of a long answer. ", "And more")[:3], hold=True)
    async with scripted_server(reply) as server, served(remote_responder(server.base_url)) as port:
        async with open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
            await rt.receive()
            await send_audio(rt, pcm16(LONGER, silence_after=1.0))
            await rt.receive_until("response.output_audio.delta", timeout=120)
            answering = list(server.left)  # the answer being spoken (and any speculative one before it)
            await send_audio(rt, pcm16("Stop, please stop.", silence_after=0.2))
            events = await rt.receive_until("response.done", timeout=120)
            assert events[-1]["response"]["status"] == "cancelled"
            with trio.fail_after(10):
                for left in answering:
                    await left.wait()
