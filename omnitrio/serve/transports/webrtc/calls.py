"""``POST /v1/realtime/calls``: a realtime session over WebRTC, in OpenAI's GA shape.

The client posts its SDP offer, as ``application/sdp`` or as ``multipart/form-data`` with the
fields ``sdp`` and ``session`` (a JSON session, applied as the session's first ``session.update``);
the answer is ``201`` with the SDP answer (``application/sdp``) and a ``Location:
/v1/realtime/calls/{call_id}``. Audio goes both ways as Opus over RTP; events go over the data
channel ``oai-events``: the same events and session as ``/v1/realtime`` (one
:class:`~.realtime.session.RealtimeSession`, a :class:`~.transport.WebRTCTransport`).
``POST /v1/realtime/calls/{call_id}/hangup`` ends a call; so does the peer closing its connection.
A bad offer is a 400 naming ``sdp``; a server without aiortc answers 501. Calls count against
``max_realtime_sessions`` on their own (WebSockets have their count in :mod:`.admission`): one call
past it is a 429 ``session_limit_reached``.

:class:`WebRTCCalls` owns every call: the app's lifespan opens it (:meth:`WebRTCCalls.lifespan`),
which starts the asyncio thread aiortc runs on (:mod:`.loop`) and the trio nursery the
calls' sessions run in; leaving it ends every call, then stops the thread. A call's session is a
task of that nursery, not of the HTTP request that answered the offer.

ICE candidates are gathered on the addresses the server listens on only (loopback by default),
each call opening one UDP port per address, chosen by the OS; DTLS, SRTP and the data channel
share it. aioice, which aiortc gathers with, offers no choice of interface and skips loopback, so
:func:`gather_on` replaces its address lookup, for the whole process.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from omnitrio.serve.api_errors import ApiError
from omnitrio.serve.auth import SECRET_SESSION
from omnitrio.serve.context import ServeContext, new_id

if TYPE_CHECKING:
    from omnitrio.serve.transports.webrtc.loop import AsyncioThread
    from omnitrio.serve.transports.webrtc.transport import WebRTCTransport

log = logging.getLogger("omnitrio.serve.webrtc")
CLOSE_TIMEOUT = 5.0  # seconds a call gets to close its peer connection when it ends
_ANY = frozenset({"", "0.0.0.0", "::"})
_every_interface: Callable[[bool, bool], list[str]] | None = None  # aioice's own lookup, once replaced


def available() -> bool:
    """Whether WebRTC can be served here (aiortc is installed: the ``speech`` extra)."""
    return importlib.util.find_spec("aiortc") is not None


def listen_addresses(hosts: Sequence[str]) -> list[str] | None:
    """The IP addresses ``hosts`` (the server's listen hosts) name; None when one is a wildcard."""
    addresses: list[str] = []
    for host in hosts:
        if host in _ANY:
            return None
        for *_, address in socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM):
            ip = str(ipaddress.ip_address(address[0]))
            if ip not in addresses:
                addresses.append(ip)
    return addresses


def gather_on(hosts: Sequence[str]) -> None:
    """Make aioice gather host candidates on ``hosts``' addresses (a wildcard: every interface, loopback too)."""
    import aioice.ice

    global _every_interface
    if _every_interface is None:
        _every_interface = aioice.ice.get_host_addresses
    everywhere = _every_interface
    chosen = listen_addresses(hosts)

    def addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        found = chosen if chosen is not None else [*everywhere(use_ipv4, use_ipv6), "127.0.0.1"]
        versions = {4} if use_ipv4 else set()
        versions |= {6} if use_ipv6 else set()
        return [ip for ip in found if ipaddress.ip_address(ip).version in versions]

    aioice.ice.get_host_addresses = addresses


class WebRTCCalls:
    """The WebRTC calls of one app (see the module docstring)."""

    def __init__(self, ctx: ServeContext, hosts: Sequence[str]) -> None:
        self.ctx = ctx
        self.hosts = tuple(hosts)
        self.calls: dict[str, WebRTCTransport] = {}
        self._thread: AsyncioThread | None = None
        self._nursery: trio.Nursery | None = None

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Serve calls inside this block; leaving it ends every call and stops aiortc's thread."""
        if not available():
            yield
            return
        from omnitrio.serve.transports.webrtc.loop import open_asyncio_thread

        gather_on(self.hosts)
        logging.getLogger("aioice").setLevel(logging.WARNING)  # it logs every ICE check at INFO
        async with open_asyncio_thread() as thread, trio.open_nursery() as nursery:
            self._thread, self._nursery = thread, nursery
            try:
                yield
            finally:
                self._thread = self._nursery = None
                nursery.cancel_scope.cancel()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/realtime/calls", self._create, methods=["POST"]),
            Route("/v1/realtime/calls/{call_id}/hangup", self._hangup, methods=["POST"]),
        ]

    async def _create(self, request: Request) -> Response:
        self.ctx.require("realtime")
        if not available():
            raise ApiError(501, "WebRTC needs aiortc: install omnitrio's speech extra", code="not_implemented")
        if self._thread is None or self._nursery is None:
            raise ApiError(503, "WebRTC calls are not being served (the app's lifespan is not running)")
        limit = self.ctx.limits.max_realtime_sessions
        if len(self.calls) >= limit:
            message = f"the server has {limit} WebRTC calls open, its limit (max_realtime_sessions); retry later"
            raise ApiError(429, message, "server_error", code="session_limit_reached", headers={"Retry-After": "1"})
        offer, first = await _offer(request)
        secret = request.scope.get("state", {}).get(SECRET_SESSION)
        if secret:
            first.insert(0, {"type": "session.update", "session": secret})
        call_id = new_id("rtc")
        transport = await self._answer(self._thread, offer, first)
        self.calls[call_id] = transport
        self._nursery.start_soon(self._run, call_id, transport)
        headers = {"Location": f"/v1/realtime/calls/{call_id}"}
        return Response(transport.peer.pc.localDescription.sdp, 201, headers, media_type="application/sdp")

    async def _answer(self, thread: AsyncioThread, offer: str, first: list[dict[str, Any]]) -> WebRTCTransport:
        from omnitrio.serve.transports.webrtc.transport import Peer, WebRTCTransport

        send, receive = thread.to_trio()

        async def make_peer() -> Peer:
            return Peer(send)

        peer = await thread.run(make_peer)
        try:
            await thread.run(peer.answer, offer)
        except Exception as exc:
            await thread.run(peer.close)
            raise ApiError(400, f"the SDP offer cannot be answered: {exc}", param="sdp") from None
        return WebRTCTransport(thread, peer, receive, first)

    async def _run(self, call_id: str, transport: WebRTCTransport) -> None:
        from omnitrio.serve.realtime.session import RealtimeSession

        log.info("WebRTC call %s started", call_id)
        try:
            await RealtimeSession(self.ctx, transport).run()
        except Exception:
            log.exception("WebRTC call %s failed", call_id)
        finally:
            self.calls.pop(call_id, None)
            log.info("WebRTC call %s ended", call_id)
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await transport.close()

    async def _hangup(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        transport = self.calls.get(call_id)
        if transport is None:
            raise ApiError(404, f"no call {call_id!r}", param="call_id", code="not_found")
        await transport.close()
        return JSONResponse({}, status_code=200)


async def _offer(request: Request) -> tuple[str, list[dict[str, Any]]]:
    """The SDP offer and the events it comes with (its ``session``, as a ``session.update``)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    match kind:
        case "application/sdp":
            sdp, session = (await request.body()).decode("utf-8", "replace"), None
        case "multipart/form-data":
            form = await request.form()
            sdp_field, session = form.get("sdp"), form.get("session")
            if not isinstance(sdp_field, str):
                raise ApiError(400, "the multipart body needs an 'sdp' field with the SDP offer", param="sdp")
            sdp = sdp_field
        case _:
            raise ApiError(
                415 if kind else 400,
                f"send the SDP offer as application/sdp, or multipart/form-data with 'sdp' and 'session'; got {kind!r}",
                code="unsupported_media_type",
            )
    if not sdp.lstrip().startswith("v=0"):
        raise ApiError(400, "the SDP offer must start with 'v=0'", param="sdp")
    first: list[dict[str, Any]] = []
    if session is not None:
        try:
            parsed = json.loads(str(session))
        except ValueError:
            raise ApiError(400, "the 'session' field is not valid JSON", param="session") from None
        if not isinstance(parsed, dict):
            raise ApiError(400, "the 'session' field must be a JSON object", param="session")
        first.append({"type": "session.update", "session": parsed})
    return sdp, first
