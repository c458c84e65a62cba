"""Responses whose body is produced while the client is watched, and SSE framing.

hypercorn drops ``send()`` silently once a client has gone, so a producer that only sends would
run to the end of its request. :class:`WatchedResponse` runs the producer next to a task that waits
for ``http.disconnect`` and then cancels the producer's scope: the pipeline request (entered with
``async with pipeline.stream(...)`` inside the producer) is aborted at every stage by that
cancellation, measured within milliseconds of the socket closing.

Headers are sent lazily, with the first body bytes. Until then a failure becomes a normal error
response with its own status (so admission errors such as ``Overloaded`` reach OpenAI clients as a
429); after that an SSE stream ends with an ``error`` event and a raw byte stream (audio) is cut
off without its terminating chunk, so the client can tell the body is incomplete.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from starlette.types import Receive, Scope, Send

from omnitrio.serve.api_errors import ApiError, as_api_error, log

SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


def sse_event(payload: Any) -> bytes:
    """One ``data:`` event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class Emitter:
    """Writes one HTTP response through ASGI ``send``; the producer's only handle on it."""

    def __init__(self, send: Send, media_type: str, headers: dict[str, str] | None = None) -> None:
        self._send = send
        self._media_type = media_type
        self._headers = dict(headers or {})
        self.started = False
        self.finished = False

    async def _start(self, status: int, media_type: str, headers: dict[str, str]) -> None:
        raw = [(b"content-type", media_type.encode())]
        raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await self._send({"type": "http.response.start", "status": status, "headers": raw})
        self.started = True

    async def write(self, data: bytes) -> None:
        """Send body bytes now (headers first, on the first call)."""
        if not self.started:
            await self._start(200, self._media_type, {"cache-control": "no-cache", **self._headers})
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def respond(self, status: int, body: bytes, media_type: str, headers: dict[str, str] | None = None) -> None:
        """Send a whole response at once (only before anything was written)."""
        await self._start(status, media_type, {"content-length": str(len(body)), **(headers or {})})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})
        self.finished = True

    async def end(self) -> None:
        if not self.finished:
            await self.write(b"")
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self.finished = True


Produce = Callable[[Emitter], Awaitable[None]]


class WatchedResponse:
    """An ASGI response running ``produce(emitter)`` until it returns or the client disconnects.

    ``stream_error`` renders an error that happens after the headers went out (an SSE ``error``
    event); without it such an error cuts the connection.
    """

    def __init__(
        self,
        produce: Produce,
        *,
        media_type: str,
        headers: dict[str, str] | None = None,
        stream_error: Callable[[ApiError], bytes] | None = None,
    ) -> None:
        self.produce = produce
        self.media_type = media_type
        self.headers = headers
        self.stream_error = stream_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        emitter = Emitter(send, self.media_type, self.headers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            try:
                await self.produce(emitter)
            except Exception as exc:
                error = as_api_error(exc)
                if not emitter.started:
                    await emitter.respond(error.status, json_bytes(error.body()), "application/json", error.headers)
                elif self.stream_error is not None:
                    await emitter.write(self.stream_error(error))
                else:
                    log.warning("stream cut off after its headers were sent: %s", error.message)
                    nursery.cancel_scope.cancel()
                    return
            await emitter.end()
            nursery.cancel_scope.cancel()


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    message = await receive()
    while message["type"] != "http.disconnect":  # body the handler left unread; only the disconnect matters
        message = await receive()
    scope.cancel()
