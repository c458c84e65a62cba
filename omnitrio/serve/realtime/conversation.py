"""A realtime session's conversation: its items in order, and what the responder is given of them.

Items are kept in OpenAI's GA shape (``{"id", "object": "realtime.item", "type", "status", ...}``):
user and system messages, assistant messages, ``function_call`` and ``function_call_output``.
What a caller may rely on:

* :meth:`Conversation.insert` places an item after ``previous_item_id`` (None: at the end,
  ``"root"``: first) and returns the id it now follows; an unknown id or a duplicate item id is an
  :class:`EventError` naming the parameter, and nothing changes.
* Audio stays with its item (PCM16 24 kHz) and is only rendered on ``retrieve``.
* :meth:`Conversation.truncate` cuts an assistant item's audio at ``audio_end_ms`` and its
  transcript to what was said up to there. The synthesizer reports the text of each sentence with
  that sentence's audio (:class:`Spoken`), not word timings, so within the sentence being played
  the heard text is taken in proportion of characters to samples, cut back to a word boundary.
* :func:`messages_of` renders items (the conversation, or a response's own ``input``) for the responder as chat messages
  (``instructions`` first, assistant audio as heard, function calls in OpenAI's chat shape: an
  assistant message with ``tool_calls``, consecutive calls in one, and a ``tool`` message with
  ``tool_call_id`` for each output); items with no text (an audio item whose transcription failed
  or was empty) are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from omnitrio.serve.audio import REALTIME_RATE, b64
from omnitrio.serve.context import new_id
from omnitrio.serve.realtime.protocol import EventError, decode_audio_append

_MS = REALTIME_RATE // 1000
_ROLES = frozenset({"user", "system", "assistant"})
_PARTS = {
    "user": frozenset({"input_text", "input_audio"}),  # input_audio: base64 PCM16 24 kHz in "audio"
    "system": frozenset({"input_text"}),
    "assistant": frozenset({"output_text", "output_audio", "text"}),
}


@attrs.define
class Spoken:
    """One piece of spoken output: its text and where its audio lies (samples at 24 kHz, growing as sent)."""

    text: str
    start: int
    samples: int


@attrs.define(eq=False)
class Item:
    """One conversation item: its public body, and its audio and timing (never sent unless retrieved)."""

    body: dict[str, Any]
    audio: bytearray = attrs.field(factory=bytearray)
    spoken: list[Spoken] = attrs.field(factory=list)
    heard: str | None = None  # a user audio item's transcript, known before the client is told it
    transcribed: trio.Event = attrs.field(factory=trio.Event)  # set when ``heard`` is final
    transcription: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    announced: trio.Event = attrs.field(factory=trio.Event)  # set once the client has seen it added

    @property
    def id(self) -> str:
        return str(self.body["id"])

    def public(self, *, with_audio: bool = False) -> dict[str, Any]:
        body = json.loads(json.dumps(self.body))
        if with_audio and self.audio:
            for part in body.get("content", ()):
                if part.get("type") in ("input_audio", "output_audio"):
                    part["audio"] = b64(bytes(self.audio))
        return body


def user_audio_item(item_id: str, audio: bytes) -> Item:
    body = {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": None}],
    }
    return Item(body, bytearray(audio))


def assistant_item(item_id: str) -> Item:
    body = {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    item = Item(body)
    item.transcribed.set()
    return item


def client_item(raw: Any, item_id: str) -> Item:
    """An item from ``conversation.item.create``, checked; ``EventError`` names the field."""
    if not isinstance(raw, Mapping):
        raise EventError("conversation.item.create needs an 'item' object", "item", code="missing_required_parameter")
    body: dict[str, Any] = {"id": raw.get("id") or item_id, "object": "realtime.item", "status": "completed"}
    if not isinstance(body["id"], str):
        raise EventError("item.id must be a string", "item.id")
    match raw.get("type", "message"):
        case "message":
            role = raw.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise EventError(f"item.role must be one of {sorted(_ROLES)}, got {role!r}", "item.role")
            content, audio = _content(raw.get("content"), role)
            body.update(type="message", role=role, content=content)
            if audio:
                return Item(body, bytearray(audio))  # transcribed by the connection, like committed audio
        case "function_call":
            fields = _strings(raw, ("call_id", "name", "arguments"))
            body.update(type="function_call", **fields)
        case "function_call_output":
            fields = _strings(raw, ("call_id", "output"))
            body.update(type="function_call_output", **fields)
        case other:
            raise EventError(
                f"item.type {other!r} is not supported; use message, function_call or function_call_output",
                "item.type",
            )
    item = Item(body)
    item.transcribed.set()
    return item


def _strings(raw: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    for key in keys:
        if not isinstance(raw.get(key), str):
            raise EventError(f"item.{key} must be a string", f"item.{key}", code="missing_required_parameter")
    return {key: raw[key] for key in keys}


def _content(content: Any, role: str) -> tuple[list[dict[str, Any]], bytes]:
    """The checked content parts, and the PCM16 of an ``input_audio`` part (at most one, alone)."""
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list of content parts", "item.content")
    parts = []
    for index, part in enumerate(content):
        param = f"item.content[{index}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(kind, str) or kind not in _PARTS[role]:
            raise EventError(f"{param}.type must be one of {sorted(_PARTS[role])} for role {role!r}", f"{param}.type")
        if kind == "input_audio":
            if len(content) != 1:
                raise EventError("an input_audio part must be the item's only part", "item.content")
            audio = decode_audio_append(part, f"{param}.audio")
            return [{"type": "input_audio", "transcript": None}], audio
        key = "transcript" if kind == "output_audio" else "text"
        if not isinstance(part.get(key), str):
            raise EventError(f"{param}.{key} must be a string", f"{param}.{key}")
        parts.append({"type": "output_text" if kind == "text" else kind, key: part[key]})
    return parts, b""


@attrs.define
class Conversation:
    """The items of one session, in order."""

    items: list[Item] = attrs.field(factory=list)
    id: str = attrs.field(factory=lambda: new_id("conv"))

    def insert(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Place ``item`` after ``previous_item_id``; returns the id it follows (None: it is first)."""
        if any(existing.id == item.id for existing in self.items):
            raise EventError(f"an item with id {item.id!r} already exists", "item.id", code="item_already_exists")
        match previous_item_id:
            case None:
                index = len(self.items)
            case "root":
                index = 0
            case str():
                index = self._index(previous_item_id, "previous_item_id") + 1
            case _:
                raise EventError("previous_item_id must be a string", "previous_item_id")
        self.items.insert(index, item)
        return self.items[index - 1].id if index else None

    def get(self, item_id: Any, param: str = "item_id") -> Item:
        return self.items[self._index(item_id, param)]

    def has_assistant_audio(self) -> bool:
        return any(item.audio and item.body.get("role") == "assistant" for item in self.items)

    def delete(self, item_id: Any) -> None:
        del self.items[self._index(item_id, "item_id")]

    def _index(self, item_id: Any, param: str) -> int:
        for index, item in enumerate(self.items):
            if item.id == item_id:
                return index
        raise EventError(f"there is no item with id {item_id!r} in the conversation", param, code="item_not_found")

    def truncate(self, item_id: Any, content_index: Any, audio_end_ms: Any) -> None:
        """Cut an assistant item's audio at ``audio_end_ms`` and its transcript to what was heard."""
        item = self.get(item_id)
        if item.body.get("role") != "assistant":
            raise EventError("only assistant messages can be truncated", "item_id", code="invalid_item_type")
        content = item.body["content"]
        if not isinstance(content_index, int) or not 0 <= content_index < len(content):
            raise EventError(f"content_index must be an index into the item's {len(content)} parts", "content_index")
        if content[content_index]["type"] != "output_audio":
            raise EventError("the content part at content_index has no audio", "content_index")
        played = len(item.audio) // 2 // _MS
        if isinstance(audio_end_ms, bool) or not isinstance(audio_end_ms, int) or not 0 <= audio_end_ms <= played:
            raise EventError(f"audio_end_ms must be an integer from 0 to the item's {played} ms", "audio_end_ms")
        end = audio_end_ms * _MS
        del item.audio[2 * end :]
        content[content_index]["transcript"] = heard_text(item.spoken, end)
        item.spoken = [s for s in item.spoken if s.start < end]


def messages_of(items: list[Item], instructions: str) -> list[dict[str, Any]]:
    """``items`` as chat messages for the responder, ``instructions`` first (see the module docstring)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        rendered = _message(item.body, item.heard)
        if rendered is None or not (rendered["content"] or rendered.get("tool_calls")):
            continue
        last = messages[-1] if messages else {}
        if rendered.get("tool_calls") and last.get("tool_calls") and not last["content"]:
            last["tool_calls"] += rendered["tool_calls"]  # calls of one answer: one assistant message
        else:
            messages.append(rendered)
    return messages


def heard_text(spoken: list[Spoken], end: int) -> str:
    """The text of ``spoken`` heard by sample ``end``: whole pieces, then a proportional, word-cut part."""
    words: list[str] = []
    for piece in spoken:
        if piece.start + piece.samples <= end:
            words.append(piece.text.strip())
        elif piece.start < end and piece.samples:
            text = piece.text.strip()
            cut = len(text) * (end - piece.start) // piece.samples
            head = text[:cut]
            if cut < len(text) and not text[cut].isspace():
                head = head.rsplit(" ", 1)[0] if " " in head else ""  # a word cut in its middle was not heard
            words.append(head.strip())
    return " ".join(word for word in words if word)


def _message(body: Mapping[str, Any], heard: str | None) -> dict[str, Any] | None:
    match body:
        case {"type": "message", "role": str(role), "content": list(content)}:
            texts = [
                (heard or "") if part["type"] == "input_audio" else (part.get("text") or part.get("transcript") or "")
                for part in content
            ]
            return {"role": role, "content": " ".join(text.strip() for text in texts if text.strip())}
        case {"type": "function_call", "name": name, "arguments": arguments, "call_id": call_id}:
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        case {"type": "function_call_output", "output": output, "call_id": call_id}:
            return {"role": "tool", "content": str(output), "tool_call_id": call_id}
    return None
