"""API keys: who may use the server.

With keys configured, every ``/v1/*`` request, and ``/metrics`` unless it is made public, must carry
``Authorization: Bearer KEY`` with one of them. The realtime WebSocket may instead offer the
subprotocol ``openai-insecure-api-key.KEY``: a browser cannot set headers on a WebSocket, so that
is how the official SDKs send the key from one. A missing or wrong key is answered 401 in the
OpenAI error shape with ``WWW-Authenticate: Bearer``; a WebSocket gets that answer instead of the
handshake (or, on an ASGI server without the denial-response extension, a close before accept,
which clients see as 403). The offered key is never echoed. Keys are compared in constant time
(:func:`hmac.compare_digest`, against every configured key). ``/health`` is always open, and with
no keys configured every route is.

A realtime handshake (``/v1/realtime``, ``/v1/realtime/calls``) may instead offer an ephemeral key
minted by ``/v1/realtime/client_secrets`` (:mod:`.routes.client_secrets`): it admits that one session and
is spent; its session settings reach the route as ``scope["state"][SECRET_SESSION]``.

``OMNITRIO_API_KEY`` holds one key or several separated by commas (whitespace around each is
ignored), so a key cannot contain a comma or whitespace.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from omnitrio.serve.api_errors import ApiError

ENV_VAR = "OMNITRIO_API_KEY"
SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
EPHEMERAL_PREFIX = "ek_"
SECRET_SESSION = "omnitrio.client_secret_session"
REALTIME_HANDSHAKES = frozenset({("websocket", None, "/v1/realtime"), ("http", "POST", "/v1/realtime/calls")})


class Ephemeral(Protocol):
    def redeem(self, value: str) -> dict[str, Any] | None: ...


def _checked_keys(keys: Iterable[str]) -> tuple[str, ...]:
    checked = tuple(keys)
    for key in checked:
        if not key or any(c.isspace() or c == "," for c in key):
            raise ValueError("an API key must be non-empty, without whitespace or commas")
    return checked


@attrs.frozen
class ApiKeys:
    """The keys that admit a client; empty: the server is open."""

    keys: tuple[str, ...] = attrs.field(default=(), converter=_checked_keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def admits(self, offered: str | None) -> bool:
        """Whether ``offered`` is one of the keys; the time taken does not depend on which, or how close."""
        if offered is None:
            return False
        token = offered.encode()
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(token, key.encode())
        return matched


def keys_from(cli_keys: Iterable[str], environ: Mapping[str, str]) -> ApiKeys:
    """The keys given with ``--api-key`` plus those in ``OMNITRIO_API_KEY`` (comma-separated)."""
    from_env = [key.strip() for key in environ.get(ENV_VAR, "").split(",") if key.strip()]
    return ApiKeys((*cli_keys, *from_env))


def offered_key(scope: Scope) -> str | None:
    """The key a client offers: the bearer token, else (WebSocket) the ``openai-insecure-api-key.`` subprotocol."""
    headers = Headers(scope=scope)
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if scope["type"] == "websocket":
        for protocol in headers.get("sec-websocket-protocol", "").split(","):
            if protocol.strip().startswith(SUBPROTOCOL_PREFIX):
                return protocol.strip().removeprefix(SUBPROTOCOL_PREFIX)
    return None


def guarded(path: str, *, public_metrics: bool) -> bool:
    """Whether ``path`` needs a key when keys are configured."""
    return path == "/v1" or path.startswith("/v1/") or (path == "/metrics" and not public_metrics)


class RequireApiKey:
    """ASGI middleware: a guarded HTTP request or WebSocket without a configured key gets 401."""

    def __init__(
        self, app: ASGIApp, keys: ApiKeys, *, public_metrics: bool = False, ephemeral: Ephemeral | None = None
    ) -> None:
        self.app = app
        self.keys = keys
        self.public_metrics = public_metrics
        self.ephemeral = ephemeral

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind, path = scope["type"], scope.get("path", "")
        if self.keys and kind in ("http", "websocket") and guarded(path, public_metrics=self.public_metrics):
            offered = offered_key(scope)
            if not self.keys.admits(offered) and not self._redeemed(scope, offered):
                await _unauthorized(scope, receive, send, offered is None)
                return
        await self.app(scope, receive, send)

    def _redeemed(self, scope: Scope, offered: str | None) -> bool:
        """Whether ``offered`` is an ephemeral key for this realtime handshake (spent now if so)."""
        if self.ephemeral is None or offered is None or not offered.startswith(EPHEMERAL_PREFIX):
            return False
        handshake = (scope["type"], scope.get("method"), scope.get("path"))
        if handshake not in REALTIME_HANDSHAKES:
            return False
        session = self.ephemeral.redeem(offered)
        if session is None:
            return False
        scope.setdefault("state", {})[SECRET_SESSION] = session
        return True


async def _unauthorized(scope: Scope, receive: Receive, send: Send, missing: bool) -> None:
    if missing:
        message = (
            "no API key: send it in an 'Authorization: Bearer KEY' header "
            f"(a browser WebSocket may offer the subprotocol '{SUBPROTOCOL_PREFIX}KEY')"
        )
    else:
        message = "the API key is not valid for this server"
    error = ApiError(401, message, code="invalid_api_key")
    if scope["type"] == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    response = JSONResponse(error.body(), status_code=401, headers={"WWW-Authenticate": "Bearer"})
    await response(scope, receive, send)  # on a WebSocket, Starlette sends it as the denial response
