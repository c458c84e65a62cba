"""``POST /v1/realtime/client_secrets``: short-lived keys that a browser page may hold instead of the real one.

A server with API keys should never hand its key to a page. A page (or the server behind it) that
has the real key mints an ephemeral one here, in OpenAI's GA shape::

    POST /v1/realtime/client_secrets   {"expires_after": {"anchor": "created_at", "seconds": 600},
                                        "session": {"type": "realtime", ...}}        (both optional)
    200 {"value": "ek_...", "expires_at": UNIX_SECONDS, "session": {the whole session}}

An ephemeral key opens one realtime session, WebSocket (``openai-insecure-api-key.ek_...``) or
WebRTC call (``Authorization: Bearer ek_...``), and nothing else: it is spent at that handshake,
and worthless once ``expires_at`` has passed (10 s to 2 h after minting, 600 s by default, as
OpenAI allows). The ``session`` given at minting is checked as ``session.update`` checks it (a bad
field is a 400 naming it); a WebRTC call opened with the key starts with it applied (a WebSocket
client sends its own ``session.update``, as the SDKs do). Keys live in this process's
memory only; a restart forgets them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.realtime.protocol import EventError, ga_session
from omnitrio.serve.realtime.session_config import default_session, updated_session

PREFIX = "ek_"
DEFAULT_SECONDS, MIN_SECONDS, MAX_SECONDS = 600, 10, 7200


@attrs.frozen
class _Secret:
    expires_at: float
    session: dict[str, Any]  # the session update to apply at the start (GA shape)


@attrs.define
class ClientSecrets:
    """The ephemeral keys minted and not yet spent or expired."""

    clock: Callable[[], float] = time.time
    _live: dict[str, _Secret] = attrs.field(factory=dict, init=False)

    def mint(self, session: dict[str, Any], seconds: int) -> tuple[str, int]:
        """A new key for one session with ``session``'s settings, and when it expires (Unix seconds)."""
        now = self.clock()
        self._live = {value: kept for value, kept in self._live.items() if kept.expires_at > now}
        value = PREFIX + secrets.token_urlsafe(24)
        expires_at = int(now + seconds)
        self._live[value] = _Secret(expires_at, session)
        return value, expires_at

    def redeem(self, value: str) -> dict[str, Any] | None:
        """Spend ``value``: the session it was minted with, or None when it is unknown, spent or expired."""
        secret = self._live.pop(value, None)
        if secret is None or secret.expires_at <= self.clock():
            return None
        return secret.session


def client_secrets_route(ctx: ServeContext, minted: ClientSecrets) -> Callable[[Request], Any]:
    return partial(_create, ctx, minted)


async def _create(ctx: ServeContext, minted: ClientSecrets, request: Request) -> Response:
    ctx.require("realtime")
    body = await _json_body(request)
    seconds = _seconds(body.get("expires_after"))
    update = body.get("session") or {}
    base = default_session(new_id("sess"), ctx.pipeline.name)
    try:
        session = updated_session(base, update)
    except EventError as error:
        raise ApiError(400, error.message, param=error.param, code=error.code or "invalid_value") from None
    value, expires_at = minted.mint(dict(update), seconds)
    return JSONResponse({"value": value, "expires_at": expires_at, "session": ga_session(session)})


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _seconds(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_SECONDS
    if not isinstance(expires_after, dict):
        raise ApiError(400, "expires_after must be an object", param="expires_after")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise ApiError(400, "expires_after.anchor must be 'created_at'", param="expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ApiError(
            400,
            f"expires_after.seconds must be an integer from {MIN_SECONDS} to {MAX_SECONDS}, got {seconds!r}",
            param="expires_after.seconds",
        )
    return seconds
