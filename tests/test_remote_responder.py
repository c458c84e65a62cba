"""The remote responder against a scripted OpenAI-compatible server: streaming, knobs, tools, abort, errors."""

from __future__ import annotations

import queue
from typing import Any

import attrs
import pytest
import trio

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, OutgoingMessage, StagePayload
from schedulers.speech.conversation import Conversation
from schedulers.speech.remote_responder import RemoteResponder, create_remote_responder_stage
from tests.chat_servers import Reply, scripted_server, text_chunks
from tests.scheduler_harness import running

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def responder(base_url: str, **options: Any) -> RemoteResponder:
    return create_remote_responder_stage(base_url=base_url, model="served-model", **options)


def chat(rid: str, *, audio: bool = False, stream: bool = True, **fields: Any) -> IncomingMessage:
    inputs = {"task": "chat", "messages": QUESTION, "modalities": ["text", "audio"] if audio else ["text"], **fields}
    request = OmniRequest(inputs=inputs, params={"stream": stream})
    return IncomingMessage(rid, "new_request", StagePayload(rid, request, {"raw_inputs": inputs}))


async def outputs(outbox: queue.Queue[OutgoingMessage], *, until: str = "result") -> list[OutgoingMessage]:
    """The request's outputs up to its ``result`` (or ``error``), taken off the trio thread."""
    got: list[OutgoingMessage] = []
    while not got or got[-1].type not in (until, "error"):
        got.append(await trio.to_thread.run_sync(outbox.get, True, 10.0))
    return got


async def test_text_streams_as_deltas_and_the_result_is_their_sum() -> None:
    reply = Reply(
        text_chunks("The capital", " of France", " is Paris.", usage={"prompt_tokens": 9, "completion_tokens": 7})
    )
    async with scripted_server(reply) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1"))
            got = await outputs(scheduler.outbox)
    streamed = [m.data["text"] for m in got if m.type == "stream"]
    assert streamed == ["The capital", " of France", " is Paris."]
    assert {m.target for m in got if m.type == "stream"} == {"text_out"}
    assert got[-1].data.data == {
        "text": "The capital of France is Paris.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 9, "completion_tokens": 7},
    }


async def test_a_spoken_answer_streams_whole_sentences_to_tts() -> None:
    reply = Reply(text_chunks("Paris is", " the capital. It is", " big. And old"))
    async with scripted_server(reply) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1", audio=True))
            got = await outputs(scheduler.outbox)
    streamed = [m.data["text"] for m in got if m.type == "stream"]
    assert streamed == ["Paris is the capital. ", "It is big. ", "And old"]
    assert {m.target for m in got if m.type == "stream"} == {"tts"}


async def test_the_request_carries_the_model_limits_knobs_stop_and_key() -> None:
    async with scripted_server(Reply(text_chunks("Hi"))) as server:
        with running(responder(server.base_url, api_key="sk-test", max_tokens=99)) as scheduler:
            scheduler.inbox.put(chat("r1", temperature=0.5, top_p=0.9, seed=3, stop=["\n"]))
            await outputs(scheduler.outbox)
    body = server.bodies[0]
    assert body["model"] == "served-model" and body["messages"] == QUESTION and body["stream"] is True
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (99, 0.5, 0.9, 3)
    assert body["stop"] == ["\n"] and "tools" not in body
    assert server.headers[0]["authorization"] == "Bearer sk-test"


async def test_penalties_and_logit_bias_go_to_the_server_under_openais_names() -> None:
    if "logit_bias" not in attrs.fields_dict(Conversation):
        pytest.skip("the conversation does not read the penalties and logit_bias yet")
    async with scripted_server(Reply(text_chunks("Hi"))) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1", frequency_penalty=0.5, presence_penalty=-0.5, logit_bias={"42": -100}))
            await outputs(scheduler.outbox)
    body = server.bodies[0]
    assert (body["frequency_penalty"], body["presence_penalty"], body["logit_bias"]) == (0.5, -0.5, {"42": -100.0})


def test_the_key_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_LLM_KEY", "sk-env")
    assert responder("http://127.0.0.1:1/v1", api_key_env="MY_LLM_KEY").server.api_key == "sk-env"
    with pytest.raises(ValueError, match="NOT_SET_KEY"):
        responder("http://127.0.0.1:1/v1", api_key_env="NOT_SET_KEY")


async def test_tools_go_to_the_server_and_its_tool_calls_come_back_in_the_result() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": "get_weather", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    async with scripted_server(Reply(chunks)) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1", messages=history, tools=[WEATHER], tool_choice="auto"))
            got = await outputs(scheduler.outbox)
    body = server.bodies[0]
    assert body["tools"] == [WEATHER] and body["tool_choice"] == "auto"
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_1" and body["messages"][1]["content"] is None
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    result = got[-1].data.data
    assert result["finish_reason"] == "tool_calls" and result["text"] == ""
    assert result["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert not [m for m in got if m.type == "stream"]


@pytest.mark.parametrize("how", ["abort()", "abort message"])
async def test_abort_closes_the_http_stream_at_once_and_the_id_starts_afresh(how: str) -> None:
    async with scripted_server(Reply(text_chunks("The capital")[:2], hold=True), Reply(text_chunks("Next."))) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1"))
            first = await outputs(scheduler.outbox, until="stream")
            assert first[-1].data == {"text": "The capital"}
            if how == "abort()":
                scheduler.abort("r1")
            else:
                scheduler.inbox.put(IncomingMessage("r1", "abort"))
            scheduler.inbox.put(chat("r1"))  # the same id again: a new life
            with trio.fail_after(10):
                await server.left[0].wait()  # the server saw the first answer's connection go
            after = await outputs(scheduler.outbox)
    assert [m.data if m.type == "stream" else m.data.data["text"] for m in after] == [{"text": "Next."}, "Next."]


async def test_a_request_the_server_refuses_is_an_invalid_request_with_its_param() -> None:
    error = {
        "message": "too long",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "param": "messages",
    }
    async with scripted_server(Reply(status=400, error=error)) as server:
        with running(responder(server.base_url)) as scheduler:
            scheduler.inbox.put(chat("r1"))
            got = await outputs(scheduler.outbox)
    failure = got[-1].data
    assert got[-1].type == "error" and isinstance(failure, InvalidRequest)
    assert (failure.code, failure.param) == ("context_length_exceeded", "messages") and "too long" in str(failure)


async def test_an_unreachable_server_is_an_error_naming_its_url() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # bound, not listening: refused
        with running(responder(url)) as scheduler:
            scheduler.inbox.put(chat("r1"))
            got = await outputs(scheduler.outbox)
    assert got[-1].type == "error" and url in str(got[-1].data)
