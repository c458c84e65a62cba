"""A small async client for an omnitrio server: HTTP routes over httpx, realtime over trio-websocket.

``OmnitrioClient`` owns one ``httpx.AsyncClient`` (use it as an async context manager). A non-2xx
answer raises :class:`ApiResponseError` carrying the status and the OpenAI error fields; streamed
routes yield decoded SSE events and stop at ``[DONE]`` or the end of the body. ``open_realtime``
yields a :class:`RealtimeClient` whose ``send``/``receive`` carry event dicts as JSON text frames, and
whose ``receive_until`` collects the events up to the one a step waits for (``response.done`` …).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
import trio_websocket


class ApiResponseError(Exception):
    """The server answered with an error status; ``error`` holds its OpenAI error fields."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"{status}: {error.get('message', error)}")
        self.status = status
        self.error = error


class OmnitrioClient:
    """Client for one server, e.g. ``OmnitrioClient("http://127.0.0.1:8000")``."""

    def __init__(self, base_url: str, *, timeout: float | None = 60.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=headers)

    async def __aenter__(self) -> OmnitrioClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> dict[str, Any]:
        """The pipeline's health report (returned whatever the status, 200 or 503)."""
        response = await self._http.get("/health")
        return response.json()

    async def models(self) -> list[str]:
        return [model["id"] for model in (await self._json("GET", "/v1/models"))["data"]]

    async def chat(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """A whole chat completion; ``fields`` are more OpenAI request fields (modalities, audio…)."""
        return await self._json("POST", "/v1/chat/completions", json={"messages": messages, **fields})

    async def chat_stream(self, messages: list[dict[str, Any]], **fields: Any) -> AsyncIterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` events of a streamed completion."""
        body = {"messages": messages, **fields, "stream": True}
        async for event in self._events("POST", "/v1/chat/completions", json=body):
            yield event

    async def speech(self, text: str, *, voice: str = "default", response_format: str = "wav", **fields: Any) -> bytes:
        """The whole audio body (WAV or raw PCM16) for ``text``."""
        body = {"input": text, "voice": voice, "response_format": response_format, **fields}
        response = await self._http.post("/v1/audio/speech", json=body)
        _raise_for_error(response)
        return response.content

    async def speech_events(self, text: str, *, voice: str = "default", **fields: Any) -> AsyncIterator[dict[str, Any]]:
        """``speech.audio.delta`` … ``speech.audio.done`` events."""
        body = {"input": text, "voice": voice, "response_format": "pcm", **fields, "stream_format": "sse"}
        async for event in self._events("POST", "/v1/audio/speech", json=body):
            yield event

    async def transcribe(self, audio: bytes, *, filename: str = "audio.wav", **fields: Any) -> dict[str, Any]:
        """``{"text": …}`` for an audio file's bytes (``response_format`` json or verbose_json)."""
        form = {name: str(value) for name, value in fields.items()}
        return await self._json("POST", "/v1/audio/transcriptions", files={"file": (filename, audio)}, data=form)

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._http.request(method, path, **kwargs)
        _raise_for_error(response)
        return response.json()

    async def _events(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        async with self._http.stream(method, path, **kwargs) as response:
            if response.is_error:
                await response.aread()
                _raise_for_error(response)
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    return
                yield json.loads(data)


def _raise_for_error(response: httpx.Response) -> None:
    if response.is_error:
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {"message": response.text}
        raise ApiResponseError(response.status_code, error)


class RealtimeClient:
    """One realtime session: JSON events in and out over a WebSocket."""

    def __init__(self, connection: trio_websocket.WebSocketConnection) -> None:
        self.connection = connection

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send_message(json.dumps(event))

    async def receive(self) -> dict[str, Any]:
        """The next server event (raises ``trio_websocket.ConnectionClosed`` once the socket closed)."""
        message = await self.connection.get_message()
        return json.loads(message)

    async def receive_until(self, *event_types: str, timeout: float | None = 60.0) -> list[dict[str, Any]]:
        """Every server event from now on, up to and including the first whose type is one of ``event_types``.

        Nothing is skipped or reordered: the list is what :meth:`receive` would have returned, in order,
        and the next :meth:`receive` gets the event after the last one listed. After ``timeout`` seconds
        without the awaited event (None: no limit) it raises ``trio.TooSlowError`` naming the types
        received meanwhile (those events are then gone); a closed socket raises as :meth:`receive` does.
        """
        if not event_types:
            raise ValueError("receive_until needs at least one event type to wait for")
        events: list[dict[str, Any]] = []
        with trio.move_on_after(float("inf") if timeout is None else timeout):
            while True:
                events.append(await self.receive())
                if events[-1].get("type") in event_types:
                    return events
        seen = [event.get("type") for event in events]
        raise trio.TooSlowError(f"no {' or '.join(event_types)} within {timeout} s; received {seen}")


@asynccontextmanager
async def open_realtime(
    url: str, *, max_message_size: int = 16 * 1024 * 1024, api_key: str | None = None
) -> AsyncIterator[RealtimeClient]:
    """Connect to ``ws://host:port/v1/realtime``; the socket closes when the block exits."""
    headers = [(b"Authorization", f"Bearer {api_key}".encode())] if api_key else None
    async with trio_websocket.open_websocket_url(
        url, max_message_size=max_message_size, message_queue_size=64, extra_headers=headers
    ) as connection:
        yield RealtimeClient(connection)
