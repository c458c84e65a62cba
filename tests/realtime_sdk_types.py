"""Checking a realtime server event against the official ``openai`` SDK's type of its name (GA or beta)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pydantic
from openai.types.beta.realtime import RealtimeServerEvent as BetaEvent
from openai.types.realtime import RealtimeServerEvent as GaEvent

GA = pydantic.TypeAdapter(GaEvent)
BETA = pydantic.TypeAdapter(BetaEvent)
SESSION_EXTRAS = {".session.id", ".session.object"}
OMNITRIO_EVENTS = {  # extension events (omnitrio.serve.realtime.interruption) and their fields
    "omnitrio.output_audio_buffer.paused": {"event_id", "response_id", "audio_end_ms", "decide_ms"},
    "omnitrio.output_audio_buffer.resumed": {"event_id", "response_id", "reason", "transcript"},
}


def checked(event: dict[str, Any], *, beta: bool = False) -> dict[str, Any]:
    """``event``, after checking it against the SDK's type of that name (GA or beta).

    Every field the type requires is there with its type, and every field sent is one the type
    defines (the SDK keeps any other as an "extra"), except a session's ``id`` and ``object``, which
    the API reference's ``session.created`` shows and the SDK's session types leave out. The beta
    types list OpenAI's own model names; this server's stands in their place. omnitrio's extension
    events are checked for their own fields.
    """
    if event["type"] in OMNITRIO_EVENTS:
        assert OMNITRIO_EVENTS[event["type"]] <= event.keys(), event
        return event
    named = json.loads(json.dumps(event))
    if beta and isinstance(named.get("session"), dict):
        named["session"]["model"] = "gpt-realtime"
    parsed = (BETA if beta else GA).validate_python(named)
    extra = [path for path in undefined_fields(parsed) if path not in SESSION_EXTRAS]
    assert not extra, f"{event['type']} has fields the SDK's type does not define: {extra}"
    return event


def undefined_fields(model: Any, path: str = "") -> list[str]:
    """Paths of the fields of a parsed SDK model (and the models inside it) that its types do not define."""
    match model:
        case pydantic.BaseModel():
            found = [f"{path}.{key}" for key in model.model_extra or {}]
            for name in type(model).model_fields:
                found += undefined_fields(getattr(model, name), f"{path}.{name}")
            return found
        case list():
            return [field for index, value in enumerate(model) for field in undefined_fields(value, f"{path}[{index}]")]
    return []


def ga_event_types() -> frozenset[str]:
    """Every ``type`` of the SDK's GA server event union."""
    members = typing.get_args(typing.get_args(GaEvent)[0])
    return frozenset(name for member in members for name in typing.get_args(member.model_fields["type"].annotation))
