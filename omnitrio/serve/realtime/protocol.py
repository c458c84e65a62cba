"""The two spellings of the realtime protocol: GA (the default) and beta (``OpenAI-Beta: realtime=v1``).

The connection builds every server event in the GA shape; :func:`render` turns it into what the
client speaks, so a client gets one protocol only and every event once. For a beta client:
``response.output_audio.*`` is ``response.audio.*``, ``response.output_audio_transcript.*`` is
``response.audio_transcript.*``, ``response.output_text.*`` is ``response.text.*``,
``conversation.item.added`` is ``conversation.item.created`` and ``conversation.item.done`` is not
sent; sessions, items and responses take their beta field names (``modalities``, content types
``audio`` / ``text``, a response's ``voice`` and ``output_audio_format``).

omnitrio's own events, outside either protocol, are named ``omnitrio.*`` (a prefix no OpenAI event
has) and go only to a session that asked for them with ``"omnitrio_events": true`` (:func:`wanted`,
which the session's writer asks, whatever the transport): clients that parse every event into the
protocol's union (the Agents SDK) never see a type they do not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket

from omnitrio.serve.realtime.session_config import beta_session, ga_session

BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
_BETA_CONTENT = {"output_audio": "audio", "output_text": "text"}
_BETA_FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
EXTENSION_PREFIX = "omnitrio."


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
        response["modalities"] = ["text", "audio"] if "audio" in response.pop("output_modalities", ()) else ["text"]
        output = response.pop("audio", {})["output"]
        response["voice"] = output["voice"]
        response["output_audio_format"] = _BETA_FORMATS.get(output["format"]["type"], output["format"]["type"])
        response["output"] = [_beta_item(item) for item in response.get("output") or ()]
        out["response"] = response
    return out


def _beta_item(item: Mapping[str, Any]) -> dict[str, Any]:
    content = item.get("content")
    if not isinstance(content, list):
        return dict(item)
    parts = [dict(part, type=_BETA_CONTENT.get(part.get("type"), part.get("type"))) for part in content]
    return {**item, "content": parts}
