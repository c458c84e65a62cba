"""``WS /v1/realtime``: one OpenAI Realtime session per WebSocket.

A connection is one nursery: a reader that applies client events in order, a writer that is the
only task sending on the socket (every server event goes through its bounded channel, so a slow
client back-pressures the response, never the reader's bookkeeping), and at most one response
task. A response runs ``pipeline.stream`` inside its own cancel scope: ``response.cancel`` cancels
that scope (the pipeline request is aborted at every stage, then ``response.done`` says
``cancelled``); the socket closing cancels the whole nursery, response included.

Input audio is appended as base64 PCM16 24 kHz, committed into the pending turn, and handed to
the pipeline on ``response.create`` as ``{"task": "realtime", "audio": float32 16 kHz array,
"session": {...}}``. Output audio is sent twice per chunk, as ``response.output_audio.delta`` (GA)
and ``response.audio.delta`` (beta), and likewise for the transcript and text deltas.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
from starlette.websockets import WebSocket

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.audio import REALTIME_RATE, TRANSCRIBE_RATE, b64, pcm16_to_float, resample
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime_session import (
    EventError,
    decode_audio_append,
    default_session,
    parse_event,
    updated_session,
)

MAX_INPUT_BYTES = 32 * 1024 * 1024  # about 11 minutes of 24 kHz PCM16, uncommitted plus committed
OUTBOX_SIZE = 64

_DELTA_EVENTS = {
    "audio": ("response.output_audio.delta", "response.audio.delta"),
    "transcript": ("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
    "text": ("response.output_text.delta", "response.text.delta"),
}


@attrs.define
class _Response:
    id: str
    item_id: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


async def realtime_endpoint(ctx: ServeContext, websocket: WebSocket) -> None:
    await websocket.accept()
    await RealtimeConnection(ctx, websocket).run()


class RealtimeConnection:
    """One session: its configuration, its input buffer, its in-flight response."""

    def __init__(self, ctx: ServeContext, websocket: WebSocket) -> None:
        self.ctx = ctx
        self.websocket = websocket
        self.session = default_session(new_id("sess"), ctx.pipeline.name)
        self.buffer = bytearray()  # appended, not committed
        self.turn: list[bytes] = []  # committed, not yet answered
        self.response: _Response | None = None
        self._outbox, self._outbox_receive = trio.open_memory_channel[dict[str, Any]](OUTBOX_SIZE)
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        """Serve until the client closes the socket; then everything of this session is cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write_events)
            await self.emit({"type": "session.created", "session": self.session})
            await self._read_events()
            nursery.cancel_scope.cancel()

    async def emit(self, event: dict[str, Any]) -> None:
        await self._outbox.send({"event_id": new_id("event"), **event})

    async def _write_events(self) -> None:
        async for event in self._outbox_receive:
            await self.websocket.send_text(json.dumps(event, separators=(",", ":")))

    async def _read_events(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            event: dict[str, Any] = {}
            try:
                text = message.get("text")
                if text is None:
                    raise EventError("binary frames are not accepted; send JSON text events", code="invalid_frame")
                event = parse_event(text)
                await self._apply(event)
            except EventError as error:
                await self._error(error, event.get("event_id"))

    async def _error(self, error: EventError, client_event_id: Any = None) -> None:
        body = {"type": "invalid_request_error", "code": error.code, "message": error.message, "param": error.param}
        await self.emit({"type": "error", "error": {**body, "event_id": client_event_id}})

    async def _apply(self, event: dict[str, Any]) -> None:
        match event["type"]:
            case "session.update":
                self.session = updated_session(self.session, event.get("session"))
                await self.emit({"type": "session.updated", "session": self.session})
            case "input_audio_buffer.append":
                data = decode_audio_append(event)
                if len(self.buffer) + sum(map(len, self.turn)) + len(data) > MAX_INPUT_BYTES:
                    raise EventError(
                        f"the input audio buffer is full ({MAX_INPUT_BYTES} bytes); commit or clear it",
                        "audio",
                        code="input_audio_buffer_full",
                    )
                self.buffer += data
            case "input_audio_buffer.commit":
                if not self.buffer:
                    raise EventError(
                        "the input audio buffer is empty; append audio before committing",
                        code="input_audio_buffer_commit_empty",
                    )
                self.turn.append(bytes(self.buffer))
                self.buffer.clear()
                await self.emit(
                    {"type": "input_audio_buffer.committed", "item_id": new_id("item"), "previous_item_id": None}
                )
            case "input_audio_buffer.clear":
                self.buffer.clear()
                await self.emit({"type": "input_audio_buffer.cleared"})
            case "response.create":
                self._start_response(event.get("response"))
            case "response.cancel":
                if self.response is None:
                    raise EventError("there is no response in progress to cancel", code="response_cancel_not_active")
                self.response.scope.cancel()
            case unknown:
                raise EventError(f"unknown event type {unknown!r}", "type", code="unknown_event")

    def _start_response(self, overrides: Any) -> None:
        if overrides is not None and not isinstance(overrides, dict):
            raise EventError("response.create's 'response' must be an object", "response")
        if self.response is not None:
            raise EventError(
                f"response {self.response.id!r} is still in progress; cancel it or wait",
                code="conversation_already_has_active_response",
            )
        assert self._nursery is not None
        audio = b"".join(self.turn)
        self.turn.clear()
        self.response = _Response(new_id("resp"), new_id("item"))
        session = {**self.session, **(overrides or {})}
        self._nursery.start_soon(self._respond, self.response, audio, session)

    async def _respond(self, response: _Response, audio: bytes, session: dict[str, Any]) -> None:
        """One response, start to ``response.done``; the pipeline request lives in ``response.scope``."""
        samples = resample(pcm16_to_float(audio), REALTIME_RATE, TRANSCRIBE_RATE)
        inputs = {"task": "realtime", "audio": samples, "session": session}
        output = Output(audio_rate=REALTIME_RATE)
        await self.emit({"type": "response.created", "response": self._response_body(response, "in_progress")})
        status: str = "completed"
        details: dict[str, Any] | None = None
        with response.scope:
            try:
                async with self.ctx.pipeline.stream(response.id, inputs, timeout=self.ctx.request_timeout) as messages:
                    async for message in messages:
                        for delta in output.add(message):
                            await self._delta(response, delta)
                for delta in output.finish():
                    await self._delta(response, delta)
            except Exception as exc:
                error = as_api_error(exc)
                status = "failed"
                failure = {"type": error.type, "code": error.code, "message": error.message}
                details = {"type": "failed", "error": failure}
                await self.emit({"type": "error", "error": {**failure, "param": None, "event_id": None}})
        if response.scope.cancelled_caught:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        self.response = None
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        if status == "completed":
            await self.emit({"type": "response.output_audio.done", **ids})
            await self.emit({"type": "response.output_audio_transcript.done", **ids, "transcript": output.transcript})
        body = self._response_body(response, status, details, output)
        await self.emit({"type": "response.done", "response": body})

    async def _delta(self, response: _Response, delta: Delta) -> None:
        value = b64(delta.value) if delta.kind == "audio" else delta.value
        fields = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        for name in _DELTA_EVENTS[delta.kind]:
            await self.emit({"type": name, **fields, "delta": value})

    def _response_body(
        self, response: _Response, status: str, details: dict[str, Any] | None = None, output: Output | None = None
    ) -> dict[str, Any]:
        content = []
        if output is not None:
            content.append({"type": "output_audio", "transcript": output.transcript})
            if output.text:
                content.append({"type": "output_text", "text": output.text})
        item = {
            "id": response.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if status == "completed" else "incomplete",
            "content": content,
        }
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [item] if output is not None else [],
            "output_modalities": self.session.get("output_modalities", ["audio"]),
            "usage": None if output is None else output.usage,
        }
