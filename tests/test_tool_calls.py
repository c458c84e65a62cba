"""A model's tool calls read from its answer in the format its chat template teaches; the grammar that forces one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schedulers.llamacpp.tool_calls import HERMES, LLAMA3, MISTRAL, tool_format_of

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def called(calls: list[dict[str, Any]] | None) -> list[tuple[str, Any]]:
    assert calls is not None
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_the_format_is_read_from_the_markers_the_template_teaches() -> None:
    assert tool_format_of("{% for t in tools %}...<tool_call>\n{{ t | tojson }}</tool_call>{% endfor %}") is HERMES
    assert tool_format_of("{{ '[AVAILABLE_TOOLS]' }}{{ tools | tojson }}{{ '[TOOL_CALLS]' }}") is MISTRAL
    llama = '<|start_header_id|>user<|end_header_id|>{"name": function name, "parameters": dictionary}'
    assert tool_format_of(llama) is LLAMA3
    assert tool_format_of("{{ '<|python_tag|>' }}") is LLAMA3
    assert tool_format_of("{{ tools | tojson }}<|im_start|>") is None


def test_hermes_calls_are_read_with_the_words_before_them() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    )
    at = HERMES.call_start(text)
    assert at is not None and text[:at] == "Let me look.\n"
    assert called(HERMES.parse(text[at:])) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


def test_a_hermes_call_missing_its_closing_tag_or_with_arguments_as_text_is_read() -> None:
    assert called(HERMES.parse('<tool_call>\n{"name": "f", "arguments": {"a": 1}}')) == [("f", {"a": 1})]
    as_text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert called(HERMES.parse(as_text)) == [("f", {"a": 1})]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> and then some words',
        '<tool_call>\n{"name": "f", "arguments": {"a": ',
    ],
)
def test_what_is_not_a_well_formed_call_is_not_read_as_one(text: str) -> None:
    assert HERMES.parse(text) is None


def test_llama3_json_calls_are_read_bare_or_after_the_python_tag() -> None:
    bare = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert LLAMA3.call_start(bare) == 0 and called(LLAMA3.parse(bare)) == [("get_weather", {"city": "Paris"})]
    tagged = 'Checking. <|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": true}}'
    at = LLAMA3.call_start(tagged)
    assert at == len("Checking. ")
    assert called(LLAMA3.parse(tagged[at:])) == [("f", {}), ("g", {"x": True})]
    assert LLAMA3.call_start("Paris is sunny {mostly}.") is None


def test_mistral_calls_are_read_from_their_list() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": {}}]'
    assert MISTRAL.call_start(text) == 0
    assert called(MISTRAL.parse(text)) == [("get_weather", {"city": "Paris"}), ("f", {})]


def test_text_that_may_still_become_a_call_is_held_and_other_text_is_not() -> None:
    assert HERMES.streamable("Sure, let me check <tool_") == len("Sure, let me check ")
    assert HERMES.streamable("a < b") == len("a < b")
    assert HERMES.streamable("It is sunny.") == len("It is sunny.")
    assert HERMES.streamable("\n") == HERMES.streamable("\n<tool_") == 0  # white space may precede a call
    assert LLAMA3.streamable("  ") == 0
    assert LLAMA3.streamable("Paris") == len("Paris")
    assert LLAMA3.call_start(' {"name"') == 1  # a Llama answer that opens with "{" is held as a call


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3, MISTRAL], ids=lambda f: f.name)
def test_the_forced_grammar_names_only_the_offered_or_chosen_function(fmt: Any) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the speech extra)")
    from schedulers.llamacpp.tool_grammar import forced_call_grammar

    other = {"type": "function", "function": {"name": "get_time"}}
    grammar = forced_call_grammar(fmt, [WEATHER, other])
    assert '"\\"get_weather\\""' in grammar and '"\\"get_time\\""' in grammar and "root ::= " in grammar
    assert f'"\\"{fmt.arguments_key}\\""' in grammar
    named = forced_call_grammar(fmt, [WEATHER, other], "get_time")
    assert "get_weather" not in named and "get_time" in named
