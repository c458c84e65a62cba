"""``WS /v1/realtime``: one OpenAI Realtime session per WebSocket.

A connection is one nursery: a reader that applies client events in order, a writer that is the
only task sending on the socket (every server event goes through its bounded channel, so a slow
client back-pressures the response, never the reader's bookkeeping), the turn listener when server
VAD is on, and at most one response task at a time (plus, with server VAD, one speculative one).
A response runs ``pipeline.stream`` inside its own cancel scope: ``response.cancel`` or barge-in
cancels that scope (the pipeline request is aborted at every stage, the audio deltas still queued
for the socket are dropped, then ``response.done`` says ``cancelled``); the socket closing cancels
the whole nursery, responses and the ASR session included.

Input audio is appended as base64 PCM16 24 kHz. With ``turn_detection: null`` it is committed by
the client and answered on ``response.create`` as ``{"task": "realtime", "audio": float32 16 kHz
array, "session": {...}}``. With server VAD (the default) the audio also streams to the
pipeline's ASR session (:mod:`.realtime_listen`); its events drive the turn:

* ``speech_started``: ``input_audio_buffer.speech_started``; a response in progress is cancelled
  (barge-in, unless ``interrupt_response`` is false) and any prepared answer is dropped;
* ``speech_paused``: the answer to the turn so far is prepared speculatively — transcription,
  responder and TTS start at once, their output is held back;
* ``speech_resumed``: the prepared answer is cancelled, silently;
* ``speech_stopped``: ``input_audio_buffer.speech_stopped`` and ``.committed``, then the prepared
  answer is released (``response.created`` and its held deltas at once), or, if none was
  prepared, a response starts now (``create_response`` false: the turn waits for ``response.create``).

Output audio is sent twice per chunk, as ``response.output_audio.delta`` (GA) and
``response.audio.delta`` (beta), and likewise for the transcript and text deltas.
"""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import attrs
import trio
from starlette.websockets import WebSocket

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.audio import REALTIME_RATE, TRANSCRIBE_RATE, b64, pcm16_to_float, resample
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime_listen import TurnListener
from omnitrio.serve.realtime_session import (
    EventError,
    TurnDetection,
    decode_audio_append,
    default_session,
    parse_event,
    turn_detection,
    updated_session,
)

MAX_INPUT_BYTES = 32 * 1024 * 1024  # about 11 minutes of 24 kHz PCM16, uncommitted plus committed
IDLE_KEEP_SAMPLES = 5 * REALTIME_RATE  # with server VAD, heard input older than this is dropped between turns
OUTBOX_SIZE = 64
_MS = REALTIME_RATE // 1000  # samples per millisecond at the API rate

_DELTA_EVENTS = {
    "audio": ("response.output_audio.delta", "response.audio.delta"),
    "transcript": ("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
    "text": ("response.output_text.delta", "response.text.delta"),
}
_AUDIO_DELTAS = frozenset(_DELTA_EVENTS["audio"])


@attrs.define(eq=False)
class _Response:
    """One response; it says nothing to the client until ``released`` (speculative until then)."""

    id: str
    item_id: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    released: trio.Event = attrs.field(factory=trio.Event)
    announced: bool = False


@attrs.define(eq=False)
class _Listening:
    """The current turn listener and where its stream starts in this connection's input (samples)."""

    detection: TurnDetection
    base: int
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    listener: TurnListener = attrs.field(init=False)


async def realtime_endpoint(ctx: ServeContext, websocket: WebSocket) -> None:
    await websocket.accept()
    await RealtimeConnection(ctx, websocket).run()


class RealtimeConnection:
    """One session: its configuration, its input buffer, its in-flight and prepared responses."""

    def __init__(self, ctx: ServeContext, websocket: WebSocket) -> None:
        self.ctx = ctx
        self.websocket = websocket
        self.session = default_session(new_id("sess"), ctx.pipeline.name)
        self.buffer = bytearray()  # appended, not committed (PCM16 24 kHz)
        self.buffer_start = 0  # input offset of buffer[0], in samples since the connection opened
        self.appended = 0  # samples appended since the connection opened
        self.turn: list[bytes] = []  # committed, not yet answered
        self.turn_start: int | None = None  # input offset where the current speech began (server VAD)
        self.item_id = new_id("item")
        self.response: _Response | None = None  # released: the client has seen response.created
        self.speculative: _Response | None = None  # prepared ahead of speech_stopped
        self.listening: _Listening | None = None
        self._silenced: set[str] = set()  # cancelled responses whose queued audio is not sent
        self._outbox, self._outbox_receive = trio.open_memory_channel[dict[str, Any]](OUTBOX_SIZE)
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        """Serve until the client closes the socket; then everything of this session is cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write_events)
            await self.emit({"type": "session.created", "session": self.session})
            self._listen()
            await self._read_events()
            nursery.cancel_scope.cancel()

    async def emit(self, event: dict[str, Any]) -> None:
        await self._outbox.send({"event_id": new_id("event"), **event})

    async def _write_events(self) -> None:
        async for event in self._outbox_receive:
            match event:
                case {"type": kind, "response_id": rid} if kind in _AUDIO_DELTAS and rid in self._silenced:
                    continue  # barge-in: audio of a cancelled response is not played
                case {"type": "response.done", "response": {"id": rid}}:
                    self._silenced.discard(rid)
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
                before = self.session.get("turn_detection")
                self.session = updated_session(self.session, event.get("session"))
                if self.session.get("turn_detection") != before:
                    self._listen()
                await self.emit({"type": "session.updated", "session": self.session})
            case "input_audio_buffer.append":
                self._append(decode_audio_append(event))
            case "input_audio_buffer.commit":
                if not self.buffer:
                    raise EventError(
                        "the input audio buffer is empty; append audio before committing",
                        code="input_audio_buffer_commit_empty",
                    )
                self.turn.append(self._take_input(self.buffer_start + len(self.buffer) // 2))
                await self._committed()
            case "input_audio_buffer.clear":
                self._take_input(self.buffer_start + len(self.buffer) // 2)
                await self.emit({"type": "input_audio_buffer.cleared"})
            case "response.create":
                self._start_response(event.get("response"))
            case "response.cancel":
                if self.response is None:
                    raise EventError("there is no response in progress to cancel", code="response_cancel_not_active")
                self._cancel(self.response)
            case unknown:
                raise EventError(f"unknown event type {unknown!r}", "type", code="unknown_event")

    # -- input audio -----------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        if len(self.buffer) + sum(map(len, self.turn)) + len(data) > MAX_INPUT_BYTES:
            raise EventError(
                f"the input audio buffer is full ({MAX_INPUT_BYTES} bytes); commit or clear it",
                "audio",
                code="input_audio_buffer_full",
            )
        self.buffer += data
        self.appended += len(data) // 2
        if self.listening is not None:
            self.listening.listener.feed(data)
            # Only audio the VAD has judged silent may go: a burst sent faster than real time is
            # still unheard, and its speech must not lose its start.
            heard = self.listening.base + self.listening.listener.heard
            if self.turn_start is None and heard - IDLE_KEEP_SAMPLES > self.buffer_start:
                self._drop_input(heard - IDLE_KEEP_SAMPLES)

    def _take_input(self, end: int, start: int | None = None) -> bytes:
        """The buffered input from ``start`` (default: the buffer's start) to ``end``, removed from the buffer.

        Anything before ``end`` leaves the buffer; a prepared answer and the current speech go with it.
        """
        begin = max(0, (start if start is not None else self.buffer_start) - self.buffer_start)
        stop = max(begin, end - self.buffer_start)
        audio = bytes(self.buffer[2 * begin : 2 * stop])
        self._drop_input(end)
        self._drop_speculation()
        self.turn_start = None
        return audio

    def _drop_input(self, end: int) -> None:
        drop = min(max(0, end - self.buffer_start), len(self.buffer) // 2)
        del self.buffer[: 2 * drop]
        self.buffer_start += drop

    async def _committed(self) -> None:
        await self.emit({"type": "input_audio_buffer.committed", "item_id": self.item_id, "previous_item_id": None})
        self.item_id = new_id("item")

    # -- server VAD --------------------------------------------------------------------------

    def _listen(self) -> None:
        """(Re)start the turn listener for the session's turn detection; stop it when that is null."""
        if self.listening is not None:
            self.listening.scope.cancel()
            self.listening = None
        self._drop_speculation()
        self.turn_start = None
        detection = turn_detection(self.session)
        if detection is None:
            return
        assert self._nursery is not None
        listening = _Listening(detection, self.appended)
        on_event = partial(self._on_vad, listening)
        listening.listener = TurnListener(
            self.ctx.pipeline, new_id("listen"), detection, on_event, timeout=self.ctx.request_timeout
        )
        self.listening = listening
        self._nursery.start_soon(self._run_listener, listening)

    async def _run_listener(self, listening: _Listening) -> None:
        with listening.scope:
            try:
                await listening.listener.run()
            except Exception as exc:
                error = as_api_error(exc)
                if self.listening is listening:
                    self.listening = None
                message = f"server turn detection stopped: {error.message}; commit input audio manually"
                failure = {"type": error.type, "code": error.code, "message": message, "param": None}
                await self.emit({"type": "error", "error": {**failure, "event_id": None}})

    async def _on_vad(self, listening: _Listening, event: dict[str, Any]) -> None:
        if self.listening is not listening:
            return  # a listener being replaced
        detection = listening.detection
        ms = next((event[key] for key in ("audio_start_ms", "audio_end_ms", "audio_ms") if key in event), 0)
        offset = listening.base + _MS * int(ms)
        match event.get("type"):
            case "speech_started":
                self._drop_speculation()
                self.turn_start = max(offset, self.buffer_start)
                if detection.interrupt_response and self.response is not None:
                    self._cancel(self.response)  # barge-in; before the event, so no audio follows it
                started = {"audio_start_ms": offset // _MS, "item_id": self.item_id}
                await self.emit({"type": "input_audio_buffer.speech_started", **started})
            case "speech_paused":
                if detection.create_response and self.response is None and self.turn_start is not None:
                    self._drop_speculation()
                    begin, end = self.turn_start - self.buffer_start, offset - self.buffer_start
                    self.speculative = self._launch(bytes(self.buffer[2 * begin : 2 * end]), dict(self.session))
            case "speech_resumed":
                self._drop_speculation()
            case "speech_stopped":
                stopped = {"audio_end_ms": offset // _MS, "item_id": self.item_id}
                await self.emit({"type": "input_audio_buffer.speech_stopped", **stopped})
                prepared, self.speculative = self.speculative, None
                audio = self._take_input(offset, self.turn_start)
                await self._committed()
                if not detection.create_response or self.response is not None:
                    self.turn.append(audio)
                    if prepared is not None:
                        prepared.scope.cancel()
                elif prepared is not None:
                    self._release(prepared)
                else:
                    self._release(self._launch(audio, dict(self.session)))

    def _drop_speculation(self) -> None:
        if self.speculative is not None:
            self.speculative.scope.cancel()
            self.speculative = None

    # -- responses ---------------------------------------------------------------------------

    def _start_response(self, overrides: Any) -> None:
        if overrides is not None and not isinstance(overrides, dict):
            raise EventError("response.create's 'response' must be an object", "response")
        if self.response is not None:
            raise EventError(
                f"response {self.response.id!r} is still in progress; cancel it or wait",
                code="conversation_already_has_active_response",
            )
        self._drop_speculation()
        audio = b"".join(self.turn)
        self.turn.clear()
        self._release(self._launch(audio, {**self.session, **(overrides or {})}))

    def _launch(self, audio: bytes, session: dict[str, Any]) -> _Response:
        """Start preparing a response; it stays silent until :meth:`_release`."""
        assert self._nursery is not None
        response = _Response(new_id("resp"), new_id("item"))
        self._nursery.start_soon(self._respond, response, audio, session)
        return response

    def _release(self, response: _Response) -> None:
        self.response = response
        response.released.set()

    def _cancel(self, response: _Response) -> None:
        self._silenced.add(response.id)
        response.scope.cancel()

    async def _respond(self, response: _Response, audio: bytes, session: dict[str, Any]) -> None:
        """One response, start to ``response.done``; the pipeline request lives in ``response.scope``."""
        output = Output(audio_rate=REALTIME_RATE)
        status: str = "completed"
        details: dict[str, Any] | None = None
        with response.scope:
            deltas_in, deltas = trio.open_memory_channel[Delta | Exception](math.inf)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._produce, response, audio, session, output, deltas_in)
                await response.released.wait()
                response.announced = True
                await self.emit({"type": "response.created", "response": self._response_body(response, "in_progress")})
                async for item in deltas:
                    if isinstance(item, Exception):
                        error = as_api_error(item)
                        status = "failed"
                        failure = {"type": error.type, "code": error.code, "message": error.message}
                        details = {"type": "failed", "error": failure}
                        await self.emit({"type": "error", "error": {**failure, "param": None, "event_id": None}})
                        break
                    await self._delta(response, item)
        if self.response is response:
            self.response = None
        if not response.announced:
            return  # a speculative answer that was never released: the client never heard of it
        if response.scope.cancelled_caught:
            status, details = "cancelled", {"type": "cancelled", "reason": "client_cancelled"}
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        if status == "completed":
            await self.emit({"type": "response.output_audio.done", **ids})
            await self.emit({"type": "response.output_audio_transcript.done", **ids, "transcript": output.transcript})
        body = self._response_body(response, status, details, output)
        await self.emit({"type": "response.done", "response": body})

    async def _produce(
        self,
        response: _Response,
        audio: bytes,
        session: dict[str, Any],
        output: Output,
        deltas: trio.MemorySendChannel[Delta | Exception],
    ) -> None:
        """Run the pipeline request; its deltas (or its failure) go to ``deltas``, held until release."""
        with deltas:
            try:
                samples = resample(pcm16_to_float(audio), REALTIME_RATE, TRANSCRIBE_RATE)
                inputs = {"task": "realtime", "audio": samples, "session": session}
                async with self.ctx.pipeline.stream(response.id, inputs, timeout=self.ctx.request_timeout) as messages:
                    async for message in messages:
                        for delta in output.add(message):
                            deltas.send_nowait(delta)
                for delta in output.finish():
                    deltas.send_nowait(delta)
            except Exception as exc:
                deltas.send_nowait(exc)

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
