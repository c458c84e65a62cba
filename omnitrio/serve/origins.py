"""Which web pages may use the server from a browser: none unless listed (``--allowed-origin``).

Without allowed origins there is no CORS: a page from another origin cannot read any answer. With
them, :func:`browser_middleware` adds Starlette's ``CORSMiddleware`` for exactly those origins (any
method, any request header, so the official SDKs' headers pass preflight); ``*`` allows every
origin. WebSocket handshakes get the same rule, since browsers apply no CORS to them: one that
carries an ``Origin`` header not allowed is refused with 403 before the route runs (the browser's
console shows the status; the page itself only sees the socket close), and the server logs a
warning naming the origin and ``--allowed-origin``, once per origin, so a page's reconnect loop does
not flood the log. A page the server itself serves (the voice page at ``/``: its origin names the
host the handshake went to) is always allowed. Clients that send no ``Origin`` (servers, scripts,
the official SDKs outside a browser) are not affected.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from omnitrio.serve.api_errors import ApiError

log = logging.getLogger("omnitrio.serve")
MAX_LOGGED_ORIGINS = 256  # distinct refused origins logged; past that, refusals are not logged


def browser_middleware(allowed_origins: Sequence[str]) -> list[Middleware]:
    """CORS for ``allowed_origins`` (none: CORS off) and the matching WebSocket origin check."""
    origins = list(allowed_origins)
    middleware = [Middleware(WebSocketOrigins, allowed=origins)]
    if origins:
        cors = Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
        middleware.insert(0, cors)
    return middleware


def _same_origin(origin: str, headers: Headers) -> bool:
    """Whether ``origin`` is this server's own, as the handshake's ``Host`` names it."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc != "" and parts.netloc == headers.get("host")


class WebSocketOrigins:
    """ASGI middleware: a WebSocket handshake from a browser page whose origin is not allowed gets 403."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)
        self.logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or "*" in self.allowed or origin in self.allowed or _same_origin(origin, headers):
            await self.app(scope, receive, send)
            return
        message = f"WebSocket connections from origin {origin!r} are not allowed (see --allowed-origin)"
        self._log_refusal(origin, scope.get("path", ""))
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": "origin not allowed"})
            return
        response = JSONResponse(ApiError(403, message, code="origin_not_allowed").body(), status_code=403)
        await response(scope, receive, send)

    def _log_refusal(self, origin: str, path: str) -> None:
        if origin in self.logged or len(self.logged) >= MAX_LOGGED_ORIGINS:
            return
        self.logged.add(origin)
        log.warning(
            "refused a WebSocket to %s from a page of origin %r: browser pages may connect only from an"
            " allowed origin; start the server with --allowed-origin %s (serve(allowed_origins=[...])) to allow it",
            path,
            origin,
            origin,
        )
