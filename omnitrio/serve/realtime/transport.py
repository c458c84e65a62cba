"""The boundary between a realtime session and the connection that carries it.

One session core (:class:`~omnitrio.serve.realtime.session.RealtimeSession`) serves every transport: the
WebSocket of ``/v1/realtime`` (:mod:`.websocket`) and any other shell that implements
:class:`RealtimeTransport`, e.g. WebRTC, whose events travel on a data channel and whose audio
travels on media tracks. A transport only moves events; it never looks into the session.

What a session relies on from a transport:

* :meth:`~RealtimeTransport.receive` returns what the client sent, in the order sent, one at a
  time: a :class:`ClientEvent` (one JSON text event, parsed and checked by the session), a
  :class:`ClientAudio` (input audio that came outside events, e.g. from a media track: the session
  appends it as ``input_audio_buffer.append`` would), or an :class:`Unreadable` (something that is
  no event, e.g. a binary WebSocket frame: the session answers with an ``error`` event); ``None``
  once the client has gone, and on every call after.
* :meth:`~RealtimeTransport.send` takes one server event in the GA shape (a JSON-ready dict, audio
  already in the session's output format) and returns once it is handed to the connection; only
  the session's writer task calls it, so events go out in the order given. A transport may render
  the event for its client (the WebSocket renders the beta protocol for a beta client) and may
  carry some events another way (a WebRTC transport plays ``response.output_audio.delta`` on its
  audio track). A send to a client that has gone returns without raising; ``receive`` then says so.
* :meth:`~RealtimeTransport.close` ends the connection with ``code`` and ``reason`` (WebSocket
  close codes); closing twice, or after the client went, does nothing.

The session is over when ``receive`` returns ``None``: its nursery (responses, transcriptions, the
turn listener) is cancelled then. Cancelling the session's task is the other way it ends.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs


@attrs.frozen
class ClientEvent:
    """One client event as the client sent it: JSON text."""

    text: str


@attrs.frozen
class ClientAudio:
    """Input audio that arrived outside events: PCM16 mono 24 kHz (little-endian)."""

    pcm16: bytes


@attrs.frozen
class Unreadable:
    """Something the client sent that is no event; ``message`` says what and what to send instead."""

    message: str


Incoming = ClientEvent | ClientAudio | Unreadable


class RealtimeTransport(Protocol):
    """What a realtime session needs from the connection that carries it (see the module docstring)."""

    async def receive(self) -> Incoming | None: ...

    async def send(self, event: dict[str, Any]) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...
