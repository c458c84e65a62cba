"""Realtime session configuration and client-event parsing, free of any socket.

The session is a plain dict in OpenAI's GA shape (``audio.input/output.format``, ``voice``,
``turn_detection``), with the beta spellings (top-level ``turn_detection``, ``voice``,
``input_audio_format``) accepted on update and mirrored, so clients of either API read back
what they set. Audio is PCM16 mono at 24 kHz both ways; any other format is refused with an
``error`` event naming the field.

``turn_detection`` is ``{"type": "server_vad", "threshold", "prefix_padding_ms", "silence_duration_ms",
"create_response", "interrupt_response"}`` (the default, with OpenAI's default values) or ``null``
(the client commits turns and asks for responses itself); :func:`turn_detection` reads it with
every field filled in. ``semantic_vad`` is refused with an error naming the field.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Mapping
from typing import Any

import attrs

from omnitrio.serve.audio import REALTIME_RATE

_PCM = {"type": "audio/pcm", "rate": REALTIME_RATE}
_FIXED = frozenset({"id", "object", "model"})


@attrs.define
class EventError(Exception):
    """A client event that cannot be applied; becomes an ``error`` event, the socket stays open."""

    message: str
    param: str | None = None
    code: str | None = "invalid_value"

    def __str__(self) -> str:
        return self.message


SERVER_VAD: dict[str, Any] = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
}


@attrs.frozen
class TurnDetection:
    """Server VAD settings with every field filled in (OpenAI's defaults for those not given)."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    create_response: bool
    interrupt_response: bool


def turn_detection(session: Mapping[str, Any]) -> TurnDetection | None:
    """The session's server VAD settings, or None when the client commits turns itself."""
    value = session.get("turn_detection")
    if value is None:
        return None
    fields = {**SERVER_VAD, **value}
    return TurnDetection(
        threshold=fields["threshold"],
        prefix_padding_ms=fields["prefix_padding_ms"],
        silence_duration_ms=fields["silence_duration_ms"],
        create_response=fields["create_response"],
        interrupt_response=fields["interrupt_response"],
    )


def default_session(session_id: str, model: str) -> dict[str, Any]:
    return {
        "id": session_id,
        "object": "realtime.session",
        "type": "realtime",
        "model": model,
        "output_modalities": ["audio"],
        "instructions": "",
        "voice": "default",
        "turn_detection": dict(SERVER_VAD),
        "audio": {
            "input": {"format": dict(_PCM), "turn_detection": dict(SERVER_VAD)},
            "output": {"format": dict(_PCM), "voice": "default"},
        },
    }


def parse_event(text: str) -> dict[str, Any]:
    """A client event: a JSON object with a string ``type``."""
    try:
        event = json.loads(text)
    except ValueError as exc:
        raise EventError(f"the event is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise EventError("the event is nested too deeply", code="invalid_json") from None
    if not isinstance(event, dict):
        raise EventError("an event must be a JSON object", code="invalid_event")
    if not isinstance(event.get("type"), str):
        raise EventError("the event has no string 'type'", "type", code="missing_required_parameter")
    return event


def decode_audio_append(event: Mapping[str, Any]) -> bytes:
    """The PCM16 bytes of an ``input_audio_buffer.append`` event."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise EventError(
            "input_audio_buffer.append needs 'audio' (base64 PCM16)", "audio", code="missing_required_parameter"
        )
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("'audio' is not valid base64", "audio", code="invalid_base64") from None
    if len(data) % 2:
        raise EventError(f"'audio' decodes to {len(data)} bytes; PCM16 needs an even count", "audio")
    return data


def updated_session(current: Mapping[str, Any], update: Any) -> dict[str, Any]:
    """``current`` with a ``session.update``'s ``session`` applied; ``current`` is not changed."""
    if not isinstance(update, Mapping):
        raise EventError("session.update needs a 'session' object", "session", code="missing_required_parameter")
    if update.get("type", "realtime") != "realtime":
        raise EventError(f"session type {update['type']!r} is not supported; use 'realtime'", "session.type")
    session = copy.deepcopy(dict(current))
    for key, value in update.items():
        match key:
            case _ if key in _FIXED:
                continue
            case "audio":
                _merge_audio(session, value)
            case "input_audio_format" | "output_audio_format":
                if value != "pcm16":
                    raise EventError(f"{key} {value!r} is not supported; use 'pcm16'", f"session.{key}")
            case "turn_detection":
                _set_turn_detection(session, value, "session.turn_detection")
            case "voice":
                session["voice"] = session["audio"]["output"]["voice"] = value
            case "modalities":
                session["output_modalities"] = value
            case _:
                session[key] = copy.deepcopy(value)
    return session


def _merge_audio(session: dict[str, Any], audio: Any) -> None:
    if not isinstance(audio, Mapping):
        raise EventError("session.audio must be an object", "session.audio")
    for direction in ("input", "output"):
        part = audio.get(direction)
        if part is None:
            continue
        if not isinstance(part, Mapping):
            raise EventError(f"session.audio.{direction} must be an object", f"session.audio.{direction}")
        for key, value in part.items():
            param = f"session.audio.{direction}.{key}"
            match key:
                case "format":
                    _check_format(value, param)
                case "turn_detection" if direction == "input":
                    _set_turn_detection(session, value, param)
                case "voice" if direction == "output":
                    session["voice"] = session["audio"]["output"]["voice"] = value
                case _:
                    session["audio"][direction][key] = copy.deepcopy(value)


def _check_format(value: Any, param: str) -> None:
    if (
        not isinstance(value, Mapping)
        or value.get("type") != "audio/pcm"
        or value.get("rate", REALTIME_RATE) != REALTIME_RATE
    ):
        raise EventError(f"{param} {value!r} is not supported; only {_PCM} (PCM16 mono 24 kHz)", param)


def _set_turn_detection(session: dict[str, Any], value: Any, param: str) -> None:
    if value is not None:
        value = _checked_turn_detection(value, param)
    session["turn_detection"] = copy.deepcopy(value)
    session["audio"]["input"]["turn_detection"] = copy.deepcopy(value)


def _checked_turn_detection(value: Any, param: str) -> dict[str, Any]:
    """A ``server_vad`` object whose fields have the right types and ranges."""
    if not isinstance(value, Mapping):
        raise EventError(f"{param} must be an object or null", param)
    if value.get("type", "server_vad") != "server_vad":
        raise EventError(
            f"{param}.type {value.get('type')!r} is not supported; use 'server_vad' or null (manual commit)",
            f"{param}.type",
        )
    checked = {"type": "server_vad", **{k: v for k, v in value.items() if k != "type"}}
    for key, item in checked.items():
        match key:
            case "threshold":
                ok = isinstance(item, int | float) and not isinstance(item, bool) and 0.0 <= item <= 1.0
                expected = "a number between 0 and 1"
            case "prefix_padding_ms" | "silence_duration_ms" | "idle_timeout_ms":
                ok = item is None if key == "idle_timeout_ms" else False
                ok = ok or (isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 10_000)
                expected = "an integer number of milliseconds between 0 and 10000"
            case "create_response" | "interrupt_response":
                ok, expected = isinstance(item, bool), "true or false"
            case _:
                ok, expected = True, ""
        if not ok:
            raise EventError(f"{param}.{key} must be {expected}, got {item!r}", f"{param}.{key}")
    return checked
