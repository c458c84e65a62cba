"""What the realtime tests expect of a server's events, written once.

:data:`GA_AUDIO_RESPONSE` is the order of an audio answer's events in the GA protocol (OpenAI's API
reference), its deltas (:data:`DELTAS`) left out; :func:`output_audio` joins an answer's audio;
:func:`checked_until` is :meth:`omnitrio.client.RealtimeClient.receive_until` with every event checked
against the official SDK's type of its name.
"""

from __future__ import annotations

import base64
from typing import Any

from omnitrio.client import RealtimeClient
from tests.realtime_sdk_types import checked

GA_AUDIO_RESPONSE = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta"}


def output_audio(events: list[dict[str, Any]], name: str = "response.output_audio.delta") -> bytes:
    """The answer's audio bytes in the session's output format: every ``name`` event's delta, in order."""
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == name)


async def checked_until(
    rt: RealtimeClient, event_type: str, *, beta: bool = False, timeout: float = 60
) -> list[dict[str, Any]]:
    """The events up to and including the first of ``event_type``, each checked against the SDK's type."""
    return [checked(event, beta=beta) for event in await rt.receive_until(event_type, timeout=timeout)]
