"""``WS /v1/realtime``: one OpenAI Realtime session per WebSocket.

A connection is one nursery: a reader that applies client events in order, a writer that is the
only task sending on the socket (every server event goes through its bounded channel, rendered for
the client's protocol by :mod:`.realtime_protocol`), the turn listener when server VAD is on,
transcriptions of committed audio (:mod:`.realtime_transcribe`), and at most one released response
at a time (plus, with server VAD, one speculative one; :mod:`.realtime_response`). Closing the
socket cancels the whole nursery: responses, transcriptions and the ASR session.

Server events follow the order of the client's events. Audio is appended as base64 PCM16 24 kHz,
or G.711 8 kHz when the session's format says so (:mod:`.realtime_formats`).
``input_audio_buffer.commit`` (or, with server VAD, the end of a turn) makes the audio a user item
of the conversation (:mod:`.realtime_conversation`): ``input_audio_buffer.committed``, then
``conversation.item.added`` / ``.done``. Audio once committed or cleared never starts a turn later:
VAD events about it are ignored, so a client that appends a recorded sentence in a burst and
commits it by hand is not interrupted by its own sentence.

With server VAD (the default) the audio also streams to the pipeline's ASR session
(:mod:`.realtime_listen`); its events drive the turn:

* ``speech_started``: ``input_audio_buffer.speech_started``; any prepared answer is dropped; a
  response in progress (unless ``interrupt_response`` is false) is paused while the speech is
  judged (:mod:`.realtime_interruption`: a backchannel resumes it, anything else cancels it,
  ``response.done`` saying ``turn_detected``), or, with ``false_interruptions: null``, cancelled at once;
* ``speech_paused``: the answer to the turn so far is prepared speculatively — transcription,
  responder and TTS start at once, their output is held back (``semantic_vad``: its transcript is
  reused, the turn model judges meanwhile; no answer when the words say the turn is unfinished);
* ``turn_judged`` (``semantic_vad``): judged incomplete, the prepared answer is dropped;
* ``speech_resumed``: the prepared answer is cancelled, silently;
* ``speech_stopped``: ``input_audio_buffer.speech_stopped`` and the commit, then the prepared
  answer is released, or, if none was prepared, a response starts now (``create_response`` false:
  the turn waits for ``response.create``).

A session opens with ``session.created`` then ``conversation.created`` (its one conversation).

With ``idle_timeout_ms``, a user silent that long after an answer has played gets
``input_audio_buffer.timeout_triggered``, the silence committed, and a response (:mod:`.realtime_idle`).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import attrs
import trio
from starlette.websockets import WebSocket

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.realtime_conversation import Conversation, Item, client_item, user_audio_item
from omnitrio.serve.realtime_formats import EdgeAudio
from omnitrio.serve.realtime_idle import IdleTimeout
from omnitrio.serve.realtime_interruption import Interruptions, Overheard
from omnitrio.serve.realtime_listen import TurnListener
from omnitrio.serve.realtime_metrics import realtime_metrics
from omnitrio.serve.realtime_protocol import render, wants_beta, wants_extensions
from omnitrio.serve.realtime_response import Response, respond
from omnitrio.serve.realtime_response_create import requested_response
from omnitrio.serve.realtime_session import (
    EventError,
    TurnDetection,
    asked_voice,
    default_session,
    parse_event,
    transcribes_input,
    turn_detection,
    updated_session,
)
from omnitrio.serve.realtime_transcribe import transcribe

IDLE_KEEP_SAMPLES = 5 * REALTIME_RATE  # with server VAD, heard input older than this is dropped between turns
OUTBOX_SIZE = 64
RELEASE_TIMEOUT = 10.0  # how long an interrupted response's release is watched, for the metric
_MS = REALTIME_RATE // 1000  # samples per millisecond at the API rate
# OpenAI's words: LiveKit ignores this error by them (its cancel on speech_started races the server's own).
CANCEL_NOT_ACTIVE = "Cancellation failed: no active response found"


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
    """One session: its configuration, input buffer, conversation, and in-flight and prepared responses."""

    def __init__(self, ctx: ServeContext, websocket: WebSocket) -> None:
        self.ctx = ctx
        self.websocket = websocket
        self.beta = wants_beta(websocket)
        self.lead = ctx.realtime_audio_lead
        self.metrics = realtime_metrics(ctx.pipeline.metrics_registry)
        self.session = default_session(new_id("sess"), ctx.pipeline.name)
        self.conversation = Conversation()
        self.edge = EdgeAudio()  # the client's audio formats (G.711 for telephony) to and from PCM16 24 kHz
        self.buffer = bytearray()  # appended, not committed (PCM16 24 kHz)
        self.buffer_start = 0  # input offset of buffer[0], in samples since the connection opened
        self.appended = 0  # samples appended since the connection opened
        self.consumed = 0  # input before this offset was committed or cleared: it starts no turn
        self.turn_start: int | None = None  # input offset where the current speech began (server VAD)
        self.item_id = new_id("item")  # the id the next committed audio item will have
        self.response: Response | None = None  # released: the client has seen response.created
        self.speculative: Response | None = None  # prepared ahead of speech_stopped
        self.listening: _Listening | None = None
        self.interruptions = Interruptions(ctx, self.emit, self._cancel)  # speech over the response
        self.idle = IdleTimeout(lambda: self.appended, self._idle_timeout)
        self.voice_asked: Any = "default"  # the voice name the client last set (every name plays one voice)
        self._outbox, self._outbox_receive = trio.open_memory_channel[tuple[dict[str, Any], Response | None]](
            OUTBOX_SIZE
        )
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        """Serve until the client closes the socket; then everything of this session is cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write_events)
            await self.emit({"type": "session.created", "session": self.session})
            conversation = {"id": self.conversation.id, "object": "realtime.conversation"}
            await self.emit({"type": "conversation.created", "conversation": conversation})
            self._listen()
            await self._read_events()
            nursery.cancel_scope.cancel()

    async def emit(self, event: dict[str, Any], response: Response | None = None) -> None:
        """Queue ``event`` (GA shape) for the client; ``response``: the response it belongs to."""
        await self._outbox.send(({"event_id": new_id("event"), **event}, response))

    async def _write_events(self) -> None:
        async for event, response in self._outbox_receive:
            audio = event["type"] == "response.output_audio.delta"
            if audio and response is not None and response.silenced:
                continue  # barge-in: audio of a cancelled response is not played
            outgoing = self.edge.outgoing(event, None if response is None else response.session)
            extensions = wants_extensions(self.session)
            rendered = None if outgoing is None else render(outgoing, beta=self.beta, extensions=extensions)
            if rendered is not None:
                await self.websocket.send_text(json.dumps(rendered, separators=(",", ":")))
            if response is not None:
                self._sent(response, event["type"])

    def _sent(self, response: Response, kind: str) -> None:
        now = trio.current_time()
        match kind:
            case "response.output_audio.delta":
                if response.first_audio_sent is None:
                    response.first_audio_sent = now
                    self.metrics.time_to_first_audio.observe(now - response.released_at)
                response.last_audio_sent = now
            case "response.done" if response.interrupted_at is not None:
                last = response.last_audio_sent or response.interrupted_at
                self.metrics.to_last_audio.observe(max(0.0, last - response.interrupted_at))

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
                asked = self._check_voice_lock(event.get("session"))
                self.session = updated_session(self.session, event.get("session"))
                self.edge.configure(self.session)
                self.voice_asked = asked
                if self.session.get("turn_detection") != before:
                    self._listen()
                await self.emit({"type": "session.updated", "session": self.session})
            case "input_audio_buffer.append":
                self._append(self.edge.incoming(event))
            case "input_audio_buffer.commit":
                if not self.buffer:
                    raise EventError(
                        "the input audio buffer is empty; append audio before committing",
                        code="input_audio_buffer_commit_empty",
                    )
                await self._commit(self._take_input(self.buffer_start + len(self.buffer) // 2))
            case "input_audio_buffer.clear":
                self._take_input(self.buffer_start + len(self.buffer) // 2)
                await self.emit({"type": "input_audio_buffer.cleared"})
            case "conversation.item.create":
                item = client_item(event.get("item"), new_id("item"))
                previous = self.conversation.insert(item, event.get("previous_item_id"))
                if not item.transcribed.is_set():
                    self._transcribe(item)
                await self._item_added(item, previous)
            case "conversation.item.retrieve":
                item = self.conversation.get(event.get("item_id"))
                await self.emit({"type": "conversation.item.retrieved", "item": item.public(with_audio=True)})
            case "conversation.item.delete":
                item = self.conversation.get(event.get("item_id"))
                item.transcription.cancel()
                self.conversation.delete(item.id)
                await self.emit({"type": "conversation.item.deleted", "item_id": item.id})
            case "conversation.item.truncate":
                fields = {key: event.get(key) for key in ("item_id", "content_index", "audio_end_ms")}
                self.conversation.truncate(**fields)
                await self.emit({"type": "conversation.item.truncated", **fields})
            case "response.create":
                self._start_response(event.get("response"))
            case "response.cancel":
                if self.response is None:
                    raise EventError(CANCEL_NOT_ACTIVE, code="response_cancel_not_active")
                self.response.interrupt("client_cancelled")
                self._interrupted(self.response)
            case unknown:
                raise EventError(f"unknown event type {unknown!r}", "type", code="unknown_event")

    # -- input audio -----------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        limit = int(self.ctx.limits.max_audio_seconds * REALTIME_RATE) * 2  # PCM16 not yet committed
        if len(self.buffer) + len(data) > limit:
            raise EventError(
                f"the input audio buffer is full ({limit} bytes, max_audio_seconds ="
                f" {self.ctx.limits.max_audio_seconds}); commit or clear it",
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

        Anything before ``end`` leaves the buffer and can start no turn; a prepared answer and the
        current speech go with it.
        """
        begin = max(0, (start if start is not None else self.buffer_start) - self.buffer_start)
        stop = max(begin, end - self.buffer_start)
        audio = bytes(self.buffer[2 * begin : 2 * stop])
        self._drop_input(end)
        self.consumed = max(self.consumed, end)
        self._drop_speculation()
        self.turn_start = None
        return audio

    def _drop_input(self, end: int) -> None:
        drop = min(max(0, end - self.buffer_start), len(self.buffer) // 2)
        del self.buffer[: 2 * drop]
        self.buffer_start += drop

    def _turn_item(self, audio: bytes, heard: str | None = None) -> Item:
        """A user audio item for the next commit, its transcription started (``heard``: known already)."""
        item = user_audio_item(self.item_id, audio)
        item.heard = heard
        self._transcribe(item)
        return item

    def _transcribe(self, item: Item, *, report: bool | None = None) -> None:
        assert self._nursery is not None
        report = transcribes_input(self.session) if report is None else report
        self._nursery.start_soon(partial(transcribe, self, item, report=report))

    async def _commit(self, audio: bytes, item: Item | None = None) -> Item:
        """Make ``audio`` a user item (``item``: one prepared for it) and tell the client."""
        if item is None:
            item = self._turn_item(audio)
        item.audio[:] = audio
        previous = self.conversation.insert(item)
        await self.emit({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": previous})
        await self._item_added(item, previous)
        self.item_id = new_id("item")
        return item

    async def _item_added(self, item: Item, previous: str | None) -> None:
        await self.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item.public()})
        await self.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item.public()})
        item.announced.set()

    # -- server VAD --------------------------------------------------------------------------

    def _listen(self) -> None:
        """(Re)start the turn listener for the session's turn detection; stop it when that is null."""
        if self.listening is not None:
            self.listening.scope.cancel()
            self.listening = None
        self._drop_speculation()
        self.turn_start = None
        detection = turn_detection(self.session)
        if detection is None or detection.idle_timeout_ms is None:
            self.idle.disarm()
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
            case "speech_started" if offset >= self.consumed:
                await self._speech_started(detection, offset)
            case "speech_resumed" if self.turn_start is None and self.response is not None and offset >= self.consumed:
                await self._speech_started(detection, offset)  # more speech over a resumed response
            case "speech_paused" if self.turn_start is not None:
                if self.interruptions.pending is not None:
                    begin, end = self.turn_start - self.buffer_start, offset - self.buffer_start
                    heard = bytes(self.buffer[2 * begin : 2 * end])
                    if await self.interruptions.judge(heard, event.get("transcript")) and self.turn_start is not None:
                        self._take_input(offset, self.turn_start)  # a backchannel is no turn
                        return
                ready = self.response is None and self.turn_start is not None and event.get("unfinished") is None
                if detection.create_response and ready:
                    self._drop_speculation()
                    begin, end = self.turn_start - self.buffer_start, offset - self.buffer_start
                    item = self._turn_item(bytes(self.buffer[2 * begin : 2 * end]), event.get("transcript"))
                    self.speculative = self._launch(Response(dict(self.session), item, self.lead))
            case "turn_judged":
                for part, ms in event["decision_ms"].items():
                    self.metrics.turn_decision.labels(part).observe(ms / 1000)
                if not event["turn_complete"]:
                    self._drop_speculation()  # the turn will likely go on: no answer kept ready meanwhile
            case "speech_resumed":
                self._drop_speculation()
            case "speech_stopped" if self.turn_start is not None:
                stopped = {"audio_end_ms": offset // _MS, "item_id": self.item_id}
                await self.emit({"type": "input_audio_buffer.speech_stopped", **stopped})
                prepared, self.speculative = self.speculative, None
                turn = prepared.turn if prepared is not None else None
                item = await self._commit(self._take_input(offset, self.turn_start), turn)
                if not detection.create_response or self.response is not None:
                    if prepared is not None:
                        prepared.scope.cancel()
                elif prepared is not None:
                    self._release(prepared)
                else:
                    self._release(self._launch(Response(dict(self.session), item, self.lead)))

    async def _speech_started(self, detection: TurnDetection, offset: int) -> None:
        self.idle.disarm()
        self._drop_speculation()
        self.turn_start = max(offset, self.buffer_start)
        overheard = self._overhear(detection)  # before the event, so no audio follows it
        started = {"audio_start_ms": offset // _MS, "item_id": self.item_id}
        await self.emit({"type": "input_audio_buffer.speech_started", **started})
        if overheard is not None:
            await self.emit(overheard.paused_event())

    def _drop_speculation(self) -> None:
        if self.speculative is not None:
            self.speculative.scope.cancel()
            if self.speculative.turn is not None:
                self.speculative.turn.transcription.cancel()
            self.speculative = None

    def _overhear(self, detection: TurnDetection) -> Overheard | None:
        """User speech over the released response: pause it to judge the speech, or cancel it now."""
        response = self.response
        if response is None or not detection.interrupt_response:
            return None
        if detection.false_interruptions is None or not response.audio:
            response.interrupt("turn_detected")
            self._interrupted(response)
            return None
        assert self._nursery is not None
        return self.interruptions.overhear(response, detection.false_interruptions, self._nursery)

    def _cancel(self, response: Response) -> None:
        """Judged a real interruption: the response is cancelled (its .done events follow) and is no
        longer in progress, so the speech, going on as a turn, may be answered at once."""
        response.interrupt("turn_detected")
        self._interrupted(response)
        if self.response is response:
            self.response = None

    # -- responses ---------------------------------------------------------------------------

    def _start_response(self, overrides: Any) -> None:
        if self.response is not None:
            raise EventError(
                f"response {self.response.id!r} is still in progress; cancel it or wait",
                code="conversation_already_has_active_response",
            )
        response = requested_response(self.session, overrides, self.conversation, self.lead)
        for item in response.context or ():
            if not item.transcribed.is_set():
                self._transcribe(item, report=False)  # an input item of this response only
        self._drop_speculation()
        self._release(self._launch(response))

    def _launch(self, response: Response) -> Response:
        """Start preparing ``response``; it stays silent until :meth:`_release`."""
        assert self._nursery is not None
        self._nursery.start_soon(respond, self, response)
        return response

    def _release(self, response: Response) -> None:
        self.idle.disarm()
        self.response = response
        response.released.set()

    def _interrupted(self, response: Response) -> None:
        if response.first_audio_sent is not None:
            self.metrics.unplayed.observe(response.pacer.held(trio.current_time()))

    def finished(self, response: Response) -> None:
        """Called by the response once its work is over, before its ``.done`` events."""
        if self.response is response:
            self.response = None
            self._arm_idle(response)
        self.interruptions.forget(response)
        if response.interrupted_at is not None and response.request_id is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self._watch_release, response)

    async def _watch_release(self, response: Response) -> None:
        """Time from the interruption until every stage has let the response's request go."""
        assert response.request_id is not None and response.interrupted_at is not None
        with trio.move_on_after(RELEASE_TIMEOUT):
            await self.ctx.pipeline.abort(response.request_id, wait=True)
            self.metrics.to_released.observe(trio.current_time() - response.interrupted_at)

    # -- idle timeout and voice ----------------------------------------------------------------

    def _arm_idle(self, response: Response) -> None:
        """With ``idle_timeout_ms``, start counting once the client has played ``response``'s audio."""
        detection = turn_detection(self.session)
        if detection is None or detection.idle_timeout_ms is None or self.turn_start is not None:
            return
        assert self._nursery is not None
        now = trio.current_time()
        self.idle.arm(self._nursery, now + response.pacer.held(now), detection.idle_timeout_ms / 1000)

    async def _idle_timeout(self, start: int) -> None:
        """No speech for ``idle_timeout_ms`` after the last answer played: commit the silence and answer."""
        end = self.appended
        span = {"audio_start_ms": start // _MS, "audio_end_ms": end // _MS, "item_id": self.item_id}
        await self.emit({"type": "input_audio_buffer.timeout_triggered", **span})
        await self._commit(self._take_input(end, start))
        detection = turn_detection(self.session)
        if detection is not None and detection.create_response and self.response is None:
            self._release(self._launch(Response(dict(self.session), None, self.lead)))

    def _check_voice_lock(self, update: Any) -> Any:
        """The voice name ``update`` leaves set; a new one once assistant audio exists is refused, as OpenAI does."""
        asked = asked_voice(update)
        if asked is None:
            return self.voice_asked
        if asked != self.voice_asked and self.conversation.has_assistant_audio():
            raise EventError(
                "Cannot update a conversation's voice if assistant audio is present.",
                "session.audio.output.voice",
                code="cannot_update_voice",
            )
        return asked
