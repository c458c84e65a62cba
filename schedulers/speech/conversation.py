"""What a language-model responder reads from a request: the conversation and the sampling knobs.

The inputs it accepts (``payload.request.inputs``):

* chat: ``{"task": "chat", "messages": [...], "max_tokens", "temperature", "top_p", "seed", "stop",
  "frequency_penalty", "presence_penalty", "logit_bias"}`` (OpenAI's meaning: ``stop`` is a string or
  up to 4; the penalties are in -2..2; ``logit_bias`` maps token ids, as ints or OpenAI's strings, to a
  bias in -100..100; ``None`` means the default);
* a plain string: one user message.

Chat and realtime inputs may also offer ``tools`` and a ``tool_choice``; an assistant message may
carry ``tool_calls`` and a ``tool`` message its ``tool_call_id`` (shapes in
:mod:`schedulers.speech.tools`; those messages keep them beside ``role`` and ``content``).

A chat whose messages carried audio arrives from the ASR stage with ``payload.data`` holding the
inputs with each clip's transcript in its place; those messages are the ones read.

Message content may be a string or OpenAI content parts (their text parts count; an ``image_url``
or other non-text part is refused, naming ``messages[i].content[j]``: this conversation has no eyes);
``developer`` is read as ``system``.  Every error is an :class:`~omnitrio.contract.InvalidRequest`
(a ``ValueError``) naming the field: the caller's mistake, answered as a 400.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers.speech.requests import content_text, raw_inputs
from schedulers.speech.tools import tool_calls_of, tool_choice_of, tools_of

_ROLES: Final = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP: Final = 4


@attrs.frozen
class Conversation:
    messages: list[dict[str, Any]]
    session_id: str | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: list[str]
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise InvalidRequest(f"messages must be a list, got {type(raw).__name__}", param="messages")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise InvalidRequest(f"messages[{i}] needs a role in {sorted(_ROLES)}", param=f"messages[{i}].role")
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type", "text") if isinstance(part, dict) else None
            if kind != "text":
                raise InvalidRequest(
                    f"messages[{i}].content[{j}]: a {kind!r} part cannot be read by this pipeline's language "
                    "model; it reads text (and audio, transcribed)",
                    code="unsupported_content",
                    param=f"messages[{i}].content[{j}]",
                )
        text = "" if content is None else content_text(content)
        read: dict[str, Any] = {"role": _ROLES[message["role"]], "content": text}
        if read["role"] == "assistant" and message.get("tool_calls"):
            read["tool_calls"] = tool_calls_of(message["tool_calls"], f"messages[{i}].tool_calls")
        if read["role"] == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(
                    f"messages[{i}]: a tool message needs the tool_call_id it answers",
                    param=f"messages[{i}].tool_call_id",
                )
            read["tool_call_id"] = call_id
        messages.append(read)
    return messages


def _optional(inputs: dict[str, Any], key: str, kind: type, low: float | None = None, high: float | None = None) -> Any:
    value: Any = inputs.get(key)
    if value is None:
        return None
    allowed: tuple[type, ...] = (float, int) if kind is float else (kind,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise InvalidRequest(f"{key} must be a {kind.__name__}, got {value!r}", param=key)
    number = float(value) if isinstance(value, int | float) else 0.0
    if (low is not None and number < low) or (high is not None and number > high):
        raise InvalidRequest(f"{key}={value!r} must be between {low} and {high}", param=key)
    return value


def _logit_bias(value: Any) -> dict[int, float] | None:
    """``{token id: bias}``: ids as ints or decimal strings (OpenAI's JSON keys), biases in -100..100."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"logit_bias must map token ids to biases, got {value!r}", param="logit_bias")
    biases: dict[int, float] = {}
    for key, bias in value.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.strip().isdigit():
            token = int(key)
        if token is None or token < 0:
            raise InvalidRequest(f"logit_bias key {key!r} is not a token id", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise InvalidRequest(f"logit_bias[{key!r}]={bias!r} must be a number in -100..100", param="logit_bias")
        biases[token] = float(bias)
    return biases


def _stop(value: Any) -> list[str]:
    match value:
        case None:
            return []
        case str():
            return [value] if value else []
        case list() if len(value) <= MAX_STOP and all(isinstance(s, str) for s in value):
            return [s for s in value if s]
    raise InvalidRequest(f"stop must be a string or a list of at most {MAX_STOP} strings, got {value!r}", param="stop")


def conversation(payload: StagePayload) -> Conversation:
    """The conversation a responder answers (shapes in the module docstring)."""
    inputs = payload.request.inputs
    if isinstance(inputs, str):
        return Conversation([{"role": "user", "content": inputs}], None, None, None, None, None, [])
    if not isinstance(inputs, dict):
        raise InvalidRequest(f"responder needs chat messages or a transcript, got {type(inputs).__name__}")
    data = raw_inputs(payload)  # a chat whose messages carried audio: ASR's transcribed copy of the inputs
    chat = data if isinstance(data, dict) and data.get("task") == "chat" and "messages" in data else inputs
    messages = _messages(chat.get("messages", []))
    if not messages and isinstance(inputs.get("text"), str):
        messages = [{"role": "user", "content": inputs["text"]}]
    session_id = inputs.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise InvalidRequest(f"session_id must be a string, got {session_id!r}", param="session_id")
    max_tokens = _optional(inputs, "max_tokens", int, 1)
    tools = tools_of(inputs.get("tools"))
    return Conversation(
        messages,
        session_id,
        max_tokens,
        _optional(inputs, "temperature", float, 0.0, 2.0),
        _optional(inputs, "top_p", float, 0.0, 1.0),
        _optional(inputs, "seed", int, -(2**63), 2**64 - 1),  # what a torch.Generator takes
        _stop(inputs.get("stop")),
        frequency_penalty=_optional(inputs, "frequency_penalty", float, -2.0, 2.0),
        presence_penalty=_optional(inputs, "presence_penalty", float, -2.0, 2.0),
        logit_bias=_logit_bias(inputs.get("logit_bias")),
        tools=tools,
        tool_choice=tool_choice_of(inputs.get("tool_choice"), tools),
    )
