"""One WebRTC call: the peer connection on the aiortc loop, and the realtime transport it gives the session.

Who owns what:

* :class:`Peer` lives on the asyncio thread (:mod:`.loop`) and is touched only there: the
  ``RTCPeerConnection``, the ``oai-events`` data channel, the answer's :class:`~.media.
  AnswerTrack` and the microphone reader. Everything the peer sends goes, in order, into one
  channel to trio: each data-channel message as a :class:`~.realtime.transport.ClientEvent`, the
  microphone as :class:`~.realtime.transport.ClientAudio`, a cut-short answer as
  :class:`~.media.Cleared`. The channel closes when the call ends (the peer hangs up, the
  connection fails, or the data channel does not open within ``CONNECT_TIMEOUT``).
* :class:`WebRTCTransport` is the trio side, a :class:`~.realtime.transport.RealtimeTransport`
  for one :class:`~.realtime.session.RealtimeSession`: the same events and session as the WebSocket,
  except that ``response.output_audio.delta`` plays on the audio track instead of going on the
  data channel, and the input audio comes from the microphone's track.

As OpenAI's WebRTC server does, the server knows what the peer heard, so it truncates for the
peer: a client's ``output_audio_buffer.clear``, or a response that ends ``cancelled`` (a barge-in,
``response.cancel``), drops the audio still queued and truncates the item at what had played
(``conversation.item.truncate`` on the peer's behalf; ``output_audio_buffer.cleared`` and
``conversation.item.truncated`` follow). Events the session sends before the data channel opens
wait for it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import trio
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from omnitrio.serve.realtime.transport import ClientAudio, ClientEvent, Incoming
from omnitrio.serve.transports.webrtc.loop import AsyncioThread, ToTrio
from omnitrio.serve.transports.webrtc.media import AnswerTrack, Cleared, read_microphone

EVENTS_CHANNEL = "oai-events"
CONNECT_TIMEOUT = 20.0  # seconds from the answer until the data channel must be open


def _compact(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


class Peer:
    """The asyncio side of one call (see the module docstring); build it with :meth:`answer`."""

    def __init__(self, inbound: ToTrio[Incoming | Cleared]) -> None:
        self.inbound = inbound
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = AnswerTrack(self.say)
        self.channel: RTCDataChannel | None = None
        self.opened = asyncio.Event()
        self._waiting: list[str] = []  # events said before the data channel opened
        self._cut: set[str] = set()  # responses cut short: their late audio is not played
        self._tasks: set[asyncio.Task[None]] = set()
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    async def answer(self, offer_sdp: str) -> str:
        """The SDP answer to ``offer_sdp`` with every local candidate in it (no trickle)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        self.pc.addTrack(self.track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self._spawn(self._watch_connect())
        return str(self.pc.localDescription.sdp)

    def say(self, event: dict[str, Any] | str) -> None:
        """Send one server event on the data channel (queued until it opens)."""
        text = event if isinstance(event, str) else _compact(event)
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)
        elif self.channel is None or self.channel.readyState == "connecting":
            self._waiting.append(text)

    def play(self, response_id: str, item_id: str, pcm16: bytes) -> None:
        if response_id not in self._cut:
            self.track.push(response_id, item_id, pcm16)

    def clear(self) -> None:
        """Cut the playing answer short; the session is told what was heard, to truncate there.

        Audio of that response still on its way (sent before the session saw the truncation) is dropped.
        """
        cleared = self.track.clear()
        if cleared is not None:
            self._cut.add(cleared.response_id)
            self.inbound.send(cleared)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()
        self.inbound.close()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_connect(self) -> None:
        try:
            await asyncio.wait_for(self.opened.wait(), CONNECT_TIMEOUT)
        except TimeoutError:
            await self.close()

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            return
        self.channel = channel

        def opened() -> None:
            for text in self._waiting:
                channel.send(text)
            self._waiting.clear()
            self.opened.set()

        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)
        channel.on("message", self._on_message)
        channel.on("close", self.inbound.close)

    def _on_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        if '"output_audio_buffer.clear"' in message:
            try:
                kind = json.loads(message).get("type")
            except (ValueError, AttributeError):
                kind = None
            if kind == "output_audio_buffer.clear":
                self.clear()
                return
        self.inbound.send(ClientEvent(message))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(read_microphone(track, lambda pcm: self.inbound.send(ClientAudio(pcm))))

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.inbound.close()


class WebRTCTransport:
    """The realtime transport of one call (see the module docstring); trio side."""

    def __init__(
        self,
        thread: AsyncioThread,
        peer: Peer,
        inbound: trio.MemoryReceiveChannel[Incoming | Cleared],
        first: list[dict[str, Any]],
    ) -> None:
        self.thread = thread
        self.peer = peer
        self.inbound = inbound
        self._first = [ClientEvent(_compact(event)) for event in first]  # given with the call (its session)
        self._closed = False

    async def receive(self) -> Incoming | None:
        if self._first:
            return self._first.pop(0)
        try:
            item = await self.inbound.receive()
        except trio.EndOfChannel:
            return None
        match item:
            case Cleared(item_id=item_id, audio_end_ms=ms):
                event = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0}
                return ClientEvent(_compact({**event, "audio_end_ms": ms}))
            case _:
                return item  # type: ignore[no-any-return]

    async def send(self, event: dict[str, Any]) -> None:
        if self._closed:
            return
        match event["type"]:
            case "response.output_audio.delta":
                pcm16 = base64.b64decode(event["delta"])
                self.thread.call_soon(self.peer.play, event["response_id"], event["item_id"], pcm16)
                return
            case "response.output_audio.done":
                self.thread.call_soon(self.peer.track.end, event["response_id"])
            case "response.done" if event["response"].get("status") == "cancelled":
                self.thread.call_soon(self.peer.clear)
        self.thread.call_soon(self.peer.say, _compact(event))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self._closed:
            self._closed = True
            await self.thread.run(self.peer.close)
