"""Admission at the door: what the server cannot take is refused before any work starts.

:class:`Admission` is ASGI middleware holding two counts against :class:`~.limits.ServeLimits`:

* HTTP ``/v1/*`` requests in flight (a streamed response holds its place until its last byte):
  one past ``max_concurrent_requests`` is answered at once 429, OpenAI error shape, with
  ``Retry-After``.
* Realtime WebSockets open: one past ``max_realtime_sessions`` is refused at connect time. The
  handshake completes only so the client can read why: one ``error`` event (code
  ``session_limit_reached``), then close code 1013 (try again later); no session is created and
  nothing reaches the pipeline. An admitted WebSocket holds its place until the session has
  ended entirely, its pipeline requests and ASR session included.

Every realtime handshake offering the subprotocol ``realtime`` (as the official SDKs do, next to
their ``openai-insecure-api-key.KEY``) is answered with it, since browsers fail a handshake whose
offered subprotocols all go unanswered. The counts live in the middleware, one per app.
"""

from __future__ import annotations

import json
import uuid

import trio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.limits import ServeLimits

REALTIME_PATH = "/v1/realtime"
REALTIME_SUBPROTOCOL = "realtime"
RETRY_AFTER_S = 1
TRY_AGAIN_LATER = 1013


def realtime_subprotocol(scope: Scope) -> str | None:
    """``realtime`` when the client offers it, else None (the handshake then names no subprotocol)."""
    offered = Headers(scope=scope).get("sec-websocket-protocol", "")
    return REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in [p.strip() for p in offered.split(",")] else None


class Admission:
    """ASGI middleware: refuses HTTP requests and realtime sessions past the limits (see the module)."""

    def __init__(self, app: ASGIApp, limits: ServeLimits) -> None:
        self.app = app
        self.limits = limits
        self.requests = trio.CapacityLimiter(limits.max_concurrent_requests)
        self.sessions = trio.CapacityLimiter(limits.max_realtime_sessions)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match scope["type"], scope.get("path", ""):
            case "http", path if path.startswith("/v1/"):
                await self._request(scope, receive, send)
            case "websocket", path if path == REALTIME_PATH:
                await self._session(scope, receive, send)
            case _:
                await self.app(scope, receive, send)

    async def _request(self, scope: Scope, receive: Receive, send: Send) -> None:
        place = object()
        try:
            self.requests.acquire_on_behalf_of_nowait(place)
        except trio.WouldBlock:
            limit = self.limits.max_concurrent_requests
            error = ApiError(
                429,
                f"the server has {limit} requests in flight, its limit (max_concurrent_requests); retry later",
                "server_error",
                code="overloaded",
            )
            response = JSONResponse(error.body(), status_code=429, headers={"Retry-After": str(RETRY_AFTER_S)})
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.requests.release_on_behalf_of(place)

    async def _session(self, scope: Scope, receive: Receive, send: Send) -> None:
        subprotocol = realtime_subprotocol(scope)
        place = object()
        try:
            self.sessions.acquire_on_behalf_of_nowait(place)
        except trio.WouldBlock:
            await self._refuse(receive, send, subprotocol)
            return
        try:
            await self.app(scope, receive, _answering_with(subprotocol, send))
        finally:
            self.sessions.release_on_behalf_of(place)

    async def _refuse(self, receive: Receive, send: Send, subprotocol: str | None) -> None:
        limit = self.limits.max_realtime_sessions
        message = f"the server has {limit} realtime sessions open, its limit (max_realtime_sessions); retry later"
        error = {"type": "server_error", "code": "session_limit_reached", "message": message, "param": None}
        event = {"type": "error", "event_id": f"event-{uuid.uuid4().hex}", "error": {**error, "event_id": None}}
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept", "subprotocol": subprotocol})
        await send({"type": "websocket.send", "text": json.dumps(event, separators=(",", ":"))})
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": "too many realtime sessions"})


def _answering_with(subprotocol: str | None, send: Send) -> Send:
    """``send``, with ``subprotocol`` put into an accept that names none."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "websocket.accept" and message.get("subprotocol") is None:
            message = {**message, "subprotocol": subprotocol}
        await send(message)

    return wrapped
