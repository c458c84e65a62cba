"""``WS /v1/realtime``: the WebSocket transport of a realtime session, and its routes.

:func:`websocket_routes` serves ``/v1/realtime``: a WebSocket upgrade runs one
:class:`~omnitrio.serve.realtime.session.RealtimeSession` over a :class:`WebSocketTransport`
(404 to the upgrade when the pipeline does not serve realtime; a ``?model=`` it does not serve is
refused with an ``error`` event and a 1008 close); a plain HTTP request there answers 426 saying to
connect with a WebSocket, or 400 naming what was wrong with its upgrade headers.

Each text frame is one client event; binary frames are :class:`~.realtime.transport.Unreadable`. A
frame past ``max_event_bytes`` ends the connection: an ``error`` event (``event_too_large``) naming
the limit, then a 1009 close whose reason says the same; ``receive`` then returns None.
Server events are rendered for the protocol the client asked for at connect (GA, or beta with
``OpenAI-Beta: realtime=v1``; :mod:`.realtime.protocol`) and sent one per text frame, compact JSON.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.api_metrics import ApiMetrics
from omnitrio.serve.context import ServeContext, error_response, new_id
from omnitrio.serve.model_names import is_accepted, unknown_model
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
        await self.send({"type": "error", "event_id": new_id("event"), "error": {**error, "event_id": None}})
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


def websocket_routes(ctx: ServeContext, metrics: ApiMetrics) -> list[BaseRoute]:
    """``/v1/realtime``: the WebSocket session, and the answer to a plain HTTP request there."""
    return [
        Route("/v1/realtime", partial(_realtime_over_http, ctx), methods=["GET"]),
        WebSocketRoute("/v1/realtime", partial(_realtime, ctx, metrics)),
    ]


async def _realtime(ctx: ServeContext, metrics: ApiMetrics, websocket: WebSocket) -> None:
    """The realtime session, or a 404 answer to the upgrade when the pipeline does not serve realtime.

    A ``?model=`` the route does not serve is refused as OpenAI refuses it: the socket opens, one
    ``error`` event (``invalid_request_error``, ``model_not_found``, naming the served model) is
    sent, and the socket closes with 1008 (policy violation)."""
    try:
        ctx.require("realtime")
    except ApiError as error:
        metrics.count("realtime_session", "client_error")
        await websocket.send_denial_response(error_response(error))
        return
    model = websocket.query_params.get("model")
    if model is not None and not is_accepted(ctx, "realtime", model):
        metrics.count("realtime_session", "client_error")
        refusal = unknown_model(ctx, "realtime", model)
        await websocket.accept()
        await websocket.send_text(json.dumps({"type": "error", "event_id": new_id("event"), **refusal.body()}))
        await websocket.close(1008, f"model {model!r} not found"[:120])
        return
    metrics.count("realtime_session", "ok")
    await realtime_endpoint(ctx, websocket)


async def _realtime_over_http(ctx: ServeContext, request: Request) -> Response:
    """A request that reached ``/v1/realtime`` without a WebSocket upgrade: say what to do instead."""
    ctx.require("realtime")
    upgrade = request.headers.get("upgrade")
    connection = request.headers.get("connection", "")
    match upgrade:
        case None:
            error = ApiError(
                426,
                "/v1/realtime is a WebSocket endpoint: connect with a WebSocket client "
                f"(ws://{request.url.netloc}/v1/realtime), not a plain HTTP request",
                code="upgrade_required",
                headers={"Upgrade": "websocket", "Connection": "Upgrade"},
            )
        case str() if upgrade.strip().lower() != "websocket":
            error = ApiError(400, f"the Upgrade header is {upgrade!r}; /v1/realtime needs 'Upgrade: websocket'")
        case _:
            error = ApiError(
                400, f"a WebSocket upgrade needs the header 'Connection: Upgrade'; the request had {connection!r}"
            )
    return error_response(error)
