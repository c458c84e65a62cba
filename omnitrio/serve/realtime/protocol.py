"""The realtime wire, both directions: what a client event is, and how server events are spelled.

**Client to server.** :func:`parse_event` reads one client event (a JSON object with a string
``type``) and :func:`decode_audio_append` the audio of an ``input_audio_buffer.append`` (or of an
``input_audio`` part); a client event that cannot be applied raises :class:`EventError`, which the
session sends back as an ``error`` event, the connection staying open.

**Server to client.** There are two spellings of the protocol: GA (the default) and beta
(``OpenAI-Beta: realtime=v1``, :func:`wants_beta`). The session builds every server event in the
GA shape; :func:`render` turns it into what the client speaks, so a client gets one protocol only
and every event once. For a beta client: ``response.output_audio.*`` is ``response.audio.*``,
``response.output_audio_transcript.*`` is ``response.audio_transcript.*``, ``response.output_text.*``
is ``response.text.*``, ``conversation.item.added`` is ``conversation.item.created`` and
``conversation.item.done`` is not sent; sessions (:func:`beta_session`), items and responses take
their beta field names (``modalities``, content types ``audio`` / ``text``, a response's ``voice``
and ``output_audio_format``, the formats ``pcm16`` / ``g711_ulaw`` / ``g711_alaw`` of
:data:`BETA_FORMATS`). A GA client reads a session without the beta spellings the session keeps
beside (:func:`ga_session`).

omnitrio's own events, outside either protocol, are named ``omnitrio.*`` (a prefix no OpenAI event
has) and go only to a session that asked for them with ``"omnitrio_events": true`` (:func:`wanted`,
which the session's writer asks, whatever the transport): clients that parse every event into the
protocol's union (the Agents SDK) never see a type they do not know.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from starlette.websockets import WebSocket

BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
"""The beta protocol's audio format names, and the GA ``type`` each stands for."""
_BETA_FORMAT_OF = {kind: name for name, kind in BETA_FORMATS.items()}
_BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}
_BETA_MIRRORS = frozenset({"voice", "turn_detection"})  # copies of audio.output.voice, audio.input.turn_detection
EXTENSION_PREFIX = "omnitrio."


@attrs.define
class EventError(Exception):
    """A client event that cannot be applied; becomes an ``error`` event, the socket stays open."""

    message: str
    param: str | None = None
    code: str | None = "invalid_value"

    def __str__(self) -> str:
        return self.message


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


def decode_audio_append(event: Mapping[str, Any], param: str = "audio", *, pcm16: bool = True) -> bytes:
    """The bytes of an ``input_audio_buffer.append`` event (or of an ``input_audio`` part): PCM16,
    or with ``pcm16`` false G.711 (one byte a sample)."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        kind = "PCM16" if pcm16 else "G.711"
        raise EventError(f"'{param}' is needed: base64 {kind}", param, code="missing_required_parameter")
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"'{param}' is not valid base64", param, code="invalid_base64") from None
    if pcm16 and len(data) % 2:
        raise EventError(f"'{param}' decodes to {len(data)} bytes; PCM16 needs an even count", param)
    return data


def wants_beta(websocket: WebSocket) -> bool:
    """Whether the client asked for the beta protocol (``OpenAI-Beta: realtime=v1``)."""
    values = (part.strip() for part in websocket.headers.get("openai-beta", "").split(","))
    return "realtime=v1" in values


def wanted(event: Mapping[str, Any], session: Mapping[str, Any]) -> bool:
    """Whether ``event`` goes to the client of ``session``: an ``omnitrio.*`` event only when the
    session asked for omnitrio's own events (``"omnitrio_events": true``), every other event always."""
    return not str(event["type"]).startswith(EXTENSION_PREFIX) or session.get("omnitrio_events") is True


def render(event: dict[str, Any], *, beta: bool) -> dict[str, Any] | None:
    """``event`` as sent to a GA or a beta client; None when that protocol has no such event."""
    if event["type"].startswith(EXTENSION_PREFIX):
        return event  # omnitrio's own, the same in both protocols
    if not beta:
        if isinstance(event.get("session"), Mapping):
            return dict(event, session=ga_session(event["session"]))
        return event
    kind = event["type"]
    if kind == "conversation.item.done":
        return None
    out = dict(event, type=BETA_NAMES.get(kind, kind))
    if isinstance(out.get("session"), Mapping):
        out["session"] = beta_session(out["session"])
    if isinstance(out.get("item"), Mapping):
        out["item"] = _beta_item(out["item"])
    if isinstance(out.get("response"), Mapping):
        response = dict(out["response"])
        response["modalities"] = _beta_modalities(response.pop("output_modalities", ()))
        output = response.pop("audio", {})["output"]
        response["voice"] = output["voice"]
        response["output_audio_format"] = _beta_format(output["format"])
        response["output"] = [_beta_item(item) for item in response.get("output") or ()]
        out["response"] = response
    return out


def ga_session(session: Mapping[str, Any]) -> dict[str, Any]:
    """``session`` as a GA client reads it: without the beta spellings kept beside (``voice``, ``turn_detection``)."""
    return {key: value for key, value in session.items() if key not in _BETA_MIRRORS}


def beta_session(session: Mapping[str, Any]) -> dict[str, Any]:
    """``session`` in the beta protocol's shape (``modalities``, ``input_audio_format``, ...)."""
    audio = session["audio"]
    return {
        "id": session["id"],
        "object": "realtime.session",
        "model": session["model"],
        "modalities": _beta_modalities(session.get("output_modalities", ["audio"])),
        "instructions": session.get("instructions", ""),
        "voice": session.get("voice"),
        "speed": audio["output"].get("speed", 1.0),
        "input_audio_format": _beta_format(audio["input"]["format"]),
        "output_audio_format": _beta_format(audio["output"]["format"]),
        "input_audio_transcription": audio["input"].get("transcription"),
        "turn_detection": _beta_turn_detection(session.get("turn_detection")),
        "tools": session.get("tools", []),
        "tool_choice": session.get("tool_choice", "auto"),
        "max_response_output_tokens": session.get("max_output_tokens", "inf"),
    }


def _beta_modalities(output_modalities: Any) -> list[str]:
    """GA ``output_modalities`` as beta ``modalities``: audio always comes with its transcript there."""
    return ["text", "audio"] if "audio" in output_modalities else ["text"]


def _beta_format(value: Mapping[str, Any]) -> str:
    return _BETA_FORMAT_OF.get(value["type"], value["type"])


def _beta_turn_detection(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The beta protocol has no ``idle_timeout_ms``: it is shown to a beta client only if it set one."""
    if value is None:
        return None
    return {key: item for key, item in value.items() if key != "idle_timeout_ms" or item is not None}


def _beta_item(item: Mapping[str, Any]) -> dict[str, Any]:
    content = item.get("content")
    if not isinstance(content, list):
        return dict(item)
    parts = [dict(part, type=_BETA_CONTENT.get(part.get("type"), part.get("type"))) for part in content]
    return {**item, "content": parts}
