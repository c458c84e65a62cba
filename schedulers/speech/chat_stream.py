"""OpenAI's streamed chat completion as a client speaks it: the request body, and the answer read back.

:func:`request_body` turns a :class:`~schedulers.speech.conversation.Conversation` into the JSON body of
``POST {base_url}/chat/completions`` with ``stream: true`` (every knob the conversation carries, under
OpenAI's name; ``None`` knobs are left to the server). :func:`sse_chunks` reads the response's lines
as server-sent events and yields each ``data:`` JSON object until ``[DONE]`` (or the end of the body).
:class:`StreamedAnswer` assembles the chunks as OpenAI defines them: ``delta.content`` appended in
order; ``delta.tool_calls`` merged by ``index`` (the first ``id`` and ``name`` seen win, ``arguments``
are appended; servers that repeat the name in every chunk are read the same); the last
``finish_reason``; ``usage`` from the chunk that carries it. Its :meth:`StreamedAnswer.result` is a
responder's result: ``{"text", "finish_reason", "usage"}`` and, when the model called tools,
``"tool_calls"`` with ``finish_reason: "tool_calls"``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs

from schedulers.speech.conversation import Conversation

_KNOBS = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")


def request_body(conv: Conversation, *, model: str, max_tokens: int) -> dict[str, Any]:
    """The streamed chat completion request for ``conv``."""
    messages = [
        {**message, "content": None} if message.get("tool_calls") and not message["content"] else message
        for message in conv.messages
    ]
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
    }
    for knob in _KNOBS:  # the ones this conversation has (a field may not exist in every version)
        value = getattr(conv, knob, None)
        if value is not None:
            body[knob] = value
    logit_bias = getattr(conv, "logit_bias", None)
    if logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in logit_bias.items()}
    if conv.stop:
        body["stop"] = conv.stop
    if conv.tools:
        body["tools"] = conv.tools
        if conv.tool_choice is not None:
            body["tool_choice"] = conv.tool_choice
    return body


async def sse_chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of the ``data:`` events in ``lines``; ends at ``data: [DONE]``.

    A ``ValueError`` names a data line that is not a JSON object (the server is not speaking
    OpenAI's protocol)."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue  # comments (": ping"), event names, ids
        event, data = "\n".join(data), []
        if event.strip() == "[DONE]":
            return
        yield _json_object(event)
    if data and "\n".join(data).strip() != "[DONE]":
        yield _json_object("\n".join(data))


def _json_object(event: str) -> dict[str, Any]:
    try:
        value = json.loads(event)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"the LLM server sent an event that is not a chat completion chunk: {event[:200]!r}")
    return value


@attrs.define
class _ToolCall:
    id: str | None = None
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)


@attrs.define
class StreamedAnswer:
    """One answer, assembled chunk by chunk (see the module docstring)."""

    parts: list[str] = attrs.field(factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] = attrs.field(factory=dict)
    calls: dict[int, _ToolCall] = attrs.field(factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, chunk: dict[str, Any]) -> None:
        if isinstance(chunk.get("usage"), dict):
            self.usage = dict(chunk["usage"])
        if isinstance(chunk.get("error"), dict):
            raise RuntimeError(f"the LLM server failed mid-answer: {chunk['error'].get('message', chunk['error'])}")
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta: dict[str, Any] = choice["delta"] if isinstance(choice.get("delta"), dict) else {}
        if isinstance(delta.get("content"), str):
            self.parts.append(delta["content"])
        for position, call in enumerate(delta.get("tool_calls") or []):
            if isinstance(call, dict):
                self._add_call(call, position)
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]

    def _add_call(self, call: dict[str, Any], position: int) -> None:
        index = call.get("index", position)
        held = self.calls.setdefault(index if isinstance(index, int) else position, _ToolCall())
        if held.id is None and isinstance(call.get("id"), str) and call["id"]:
            held.id = call["id"]
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        if not held.name and isinstance(function.get("name"), str):
            held.name = function["name"]
        if isinstance(function.get("arguments"), str):
            held.arguments.append(function["arguments"])

    def result(self) -> dict[str, Any]:
        """The responder's result; an answer whose stream ended without a ``finish_reason`` is an error."""
        if self.finish_reason is None:
            raise RuntimeError("the LLM server's stream ended before the answer did (no finish_reason)")
        result: dict[str, Any] = {"text": self.text, "finish_reason": self.finish_reason, "usage": self.usage}
        calls = [
            {
                "id": call.id or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.name, "arguments": "".join(call.arguments)},
            }
            for _, call in sorted(self.calls.items())
            if call.name
        ]
        if calls:
            result["tool_calls"] = calls
            result["finish_reason"] = "tool_calls"
        return result
