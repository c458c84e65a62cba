"""``WS /v1/realtime``: the WebSocket transport of a realtime session.

Each text frame is one client event; binary frames are :class:`~.realtime.transport.Unreadable`. A
frame past ``max_event_bytes`` ends the connection: an ``error`` event (``event_too_large``) naming
the limit, then a 1009 close whose reason says the same; ``receive`` then returns None.
Server events are rendered for the protocol the client asked for at connect (GA, or beta with
``OpenAI-Beta: realtime=v1``; :mod:`.realtime.protocol`) and sent one per text frame, compact JSON.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omnitrio.serve.context import ServeContext
from omnitrio.serve.realtime.protocol import render, wants_beta
from omnitrio.serve.realtime.session import RealtimeSession
from omnitrio.serve.realtime.transport import ClientEvent, Incoming, Unreadable


class WebSocketTransport:
    """A :class:`~.realtime.transport.RealtimeTransport` over an accepted Starlette WebSocket."""

    def __init__(self, websocket: WebSocket, *, max_event_bytes: int | None = None) -> None:
        self.websocket = websocket
        self.beta = wants_beta(websocket)
        self.max_event_bytes = max_event_bytes
        self._gone = False

    async def receive(self) -> Incoming | None:
        if self._gone:
            return None
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            self._gone = True
            return None
        size = len(message.get("text") or message.get("bytes") or "")
        if self.max_event_bytes is not None and size > self.max_event_bytes:
            await self._refuse_too_large(size, self.max_event_bytes)
            return None
        text = message.get("text")
        if text is None:
            return Unreadable("binary frames are not accepted; send JSON text events")
        return ClientEvent(text)

    async def _refuse_too_large(self, size: int, limit: int) -> None:
        why = f"an event of {size} bytes is over this server's limit of {limit} bytes (max_event_bytes)"
        error = {"type": "invalid_request_error", "code": "event_too_large", "message": why, "param": None}
        await self.send(
            {"type": "error", "event_id": f"event-{uuid.uuid4().hex}", "error": {**error, "event_id": None}}
        )
        await self.close(1009, why[:120])

    async def send(self, event: dict[str, Any]) -> None:
        rendered = render(event, beta=self.beta)
        if rendered is None or self._gone:
            return
        try:
            await self.websocket.send_text(json.dumps(rendered, separators=(",", ":")))
        except (WebSocketDisconnect, RuntimeError):
            self._gone = True  # the client left; receive() says so next

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._gone or self.websocket.application_state != WebSocketState.CONNECTED:
            return
        self._gone = True
        await self.websocket.close(code, reason)


async def realtime_endpoint(ctx: ServeContext, websocket: WebSocket) -> None:
    """Accept ``websocket``, then run one :class:`~.realtime.session.RealtimeSession` over it until it ends."""
    await websocket.accept()
    await RealtimeSession(ctx, WebSocketTransport(websocket, max_event_bytes=ctx.limits.max_event_bytes)).run()
