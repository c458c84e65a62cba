"""A realtime session's audio formats at its edge: the client's format in and out, PCM16 24 kHz inside.

Everything inside the connection (the input buffer, VAD, items, responses, pacing) is PCM16 mono
24 kHz. A session whose ``audio.input.format`` is G.711 (``audio/pcmu`` or ``audio/pcma``, 8 kHz)
has each append decoded and resampled by one stateful :class:`~omnitrio.serve.realtime.g711.TelephonyDecoder`
(a new one when the input format changes); one whose ``audio.output.format`` is G.711 gets every
``response.output_audio.delta`` resampled and encoded on its way to the socket, by one stateful
:class:`~omnitrio.serve.realtime.g711.TelephonyEncoder` per response (kept until that response's
``response.output_audio.done``, just before which :meth:`EdgeAudio.tail` gives the samples its
filter still held, as one last delta). A response keeps the output format it started with.

Audio inside items (``conversation.item.create`` input audio parts, ``conversation.item.retrieve``)
stays PCM16 24 kHz whatever the session's formats.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from omnitrio.serve.realtime.g711 import G711Law, TelephonyDecoder, TelephonyEncoder, g711_law
from omnitrio.serve.realtime.protocol import decode_audio_append
from omnitrio.serve.realtime.session_config import audio_format

_PCM = "audio/pcm"


def _law(kind: str) -> G711Law | None:
    return None if kind == _PCM else g711_law(kind)


class EdgeAudio:
    """Converts one connection's audio between the client's formats and PCM16 24 kHz."""

    def __init__(self) -> None:
        self._input: G711Law | None = None
        self._decoder: TelephonyDecoder | None = None
        self._encoders: dict[str, TelephonyEncoder] = {}  # by response id, until its audio is done

    def configure(self, session: Mapping[str, Any]) -> None:
        """Follow the session's input format (a changed one starts a fresh decoder)."""
        law = _law(audio_format(session, "input"))
        if law != self._input:
            self._input = law
            self._decoder = None if law is None else TelephonyDecoder(law)

    def incoming(self, event: Mapping[str, Any]) -> bytes:
        """The PCM16 24 kHz audio of an ``input_audio_buffer.append`` (EventError names a bad ``audio``)."""
        if self._decoder is None:
            return decode_audio_append(event)
        return self._decoder.push(decode_audio_append(event, pcm16=False))

    def outgoing(self, event: dict[str, Any], session: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``event`` as the client takes it (``session``: the session of the response it belongs to);
        None when nothing is left to send (a G.711 delta shorter than one output sample)."""
        match event["type"]:
            case "response.output_audio.delta" if session is not None:
                law = _law(audio_format(session, "output"))
                if law is None:
                    return event
                encoder = self._encoders.get(event["response_id"])
                if encoder is None:
                    encoder = self._encoders[event["response_id"]] = TelephonyEncoder(law)
                encoded = encoder.push(base64.b64decode(event["delta"]))
                return {**event, "delta": base64.b64encode(encoded).decode()} if encoded else None
            case "response.output_audio.done":
                self._encoders.pop(event["response_id"], None)
        return event

    def tail(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """Before a ``response.output_audio.done``: the response's last G.711 delta (what its encoder
        still held), or None (PCM16 output, nothing held, or another event)."""
        encoder = self._encoders.get(event["response_id"]) if event["type"] == "response.output_audio.done" else None
        encoded = encoder.flush() if encoder is not None else b""
        if not encoded:
            return None
        ids = {key: event[key] for key in ("response_id", "item_id", "output_index", "content_index")}
        return {"type": "response.output_audio.delta", **ids, "delta": base64.b64encode(encoded).decode()}
