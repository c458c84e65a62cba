"""What a language-model responder reads from a request: the conversation and the sampling knobs.

The inputs it accepts (``payload.request.inputs``):

* chat: ``{"task": "chat", "messages": [...], "max_tokens", "temperature", "top_p", "seed", "stop"}``
  (OpenAI's meaning: ``stop`` is a string or up to 4; ``None`` means the default);
* a realtime turn: ``{"task": "realtime", "messages": [...], "session_id": str, "max_tokens"}``
  whose transcript (``payload.data["text"]``, from the ASR stage) is appended as the last user message;
* a plain string: one user message.

Chat and realtime inputs may also offer ``tools`` and a ``tool_choice``; an assistant message may
carry ``tool_calls`` and a ``tool`` message its ``tool_call_id`` (shapes in
:mod:`schedulers.speech.tools`; those messages keep them beside ``role`` and ``content``).

A chat whose messages carried audio arrives from the ASR stage with ``payload.data`` holding the
inputs with each clip's transcript in its place; those messages are the ones read.

Message content may be a string or OpenAI content parts (their text parts count); ``developer``
is read as ``system``.  Every error is a ``ValueError`` naming the field.
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
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ValueError(f"messages must be a list, got {type(raw).__name__}")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ValueError(f"messages[{i}] needs a role in {sorted(_ROLES)}")
        content = message.get("content")
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
        raise ValueError(f"{key} must be a {kind.__name__}, got {value!r}")
    number = float(value) if isinstance(value, int | float) else 0.0
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{key}={value!r} must be between {low} and {high}")
    return value


def _stop(value: Any) -> list[str]:
    match value:
        case None:
            return []
        case str():
            return [value] if value else []
        case list() if len(value) <= MAX_STOP and all(isinstance(s, str) for s in value):
            return [s for s in value if s]
    raise ValueError(f"stop must be a string or a list of at most {MAX_STOP} strings, got {value!r}")


def conversation(payload: StagePayload) -> Conversation:
    """The conversation a responder answers (shapes in the module docstring)."""
    inputs = payload.request.inputs
    if isinstance(inputs, str):
        return Conversation([{"role": "user", "content": inputs}], None, None, None, None, None, [])
    if not isinstance(inputs, dict):
        raise ValueError(f"responder needs chat messages or a transcript, got {type(inputs).__name__}")
    data = raw_inputs(payload)  # a chat whose messages carried audio: ASR's transcribed copy of the inputs
    chat = data if isinstance(data, dict) and data.get("task") == "chat" and "messages" in data else inputs
    messages = _messages(chat.get("messages", []))
    if inputs.get("task") == "realtime":
        data = payload.data
        transcript = data.get("text") if isinstance(data, dict) else None
        if not isinstance(transcript, str):
            raise ValueError("a realtime turn reaches the responder with its transcript as {'text': str}")
        if transcript.strip():
            messages.append({"role": "user", "content": transcript.strip()})
    elif not messages and isinstance(inputs.get("text"), str):
        messages = [{"role": "user", "content": inputs["text"]}]
    session_id = inputs.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        raise ValueError(f"session_id must be a string, got {session_id!r}")
    max_tokens = _optional(inputs, "max_tokens", int, 1)
    tools = tools_of(inputs.get("tools"))
    return Conversation(
        messages,
        session_id,
        max_tokens,
        _optional(inputs, "temperature", float, 0.0, 2.0),
        _optional(inputs, "top_p", float, 0.0, 1.0),
        _optional(inputs, "seed", int),
        _stop(inputs.get("stop")),
        tools=tools,
        tool_choice=tool_choice_of(inputs.get("tool_choice"), tools),
    )


def unheard(payload: Any) -> bool:
    """Whether ``payload`` is a realtime turn whose transcript is empty (noise, a cough): answered with silence."""
    if not isinstance(payload, StagePayload) or not isinstance(payload.request.inputs, dict):
        return False
    data = payload.data
    transcript = data.get("text") if isinstance(data, dict) else None
    return payload.request.inputs.get("task") == "realtime" and isinstance(transcript, str) and not transcript.strip()
