"""One OpenAI Realtime session, over any transport (:mod:`.transport`; ``WS /v1/realtime``
is :mod:`~omnitrio.serve.transports.websocket`, ``POST /v1/realtime/calls``
:mod:`~omnitrio.serve.transports.webrtc`).

A session is one nursery: a reader that applies client events in order, a writer that is the
only task sending to the transport (every server event goes through its bounded channel), the turn
listener when server VAD is on, transcriptions of committed audio (:mod:`.transcribe`),
and at most one released response at a time (plus, with server VAD, one speculative one;
:mod:`.response`). The client leaving cancels the whole nursery: responses,
transcriptions and the ASR session. What happens at each VAD event is decided by the turn core,
:mod:`.turn`; this module carries its decisions out.

Server events follow the order of the client's events. Audio is appended as base64 PCM16 24 kHz,
or G.711 8 kHz when the session's format says so (:mod:`.formats`).
``input_audio_buffer.commit`` (or, with server VAD, the end of a turn) makes the audio a user item
of the conversation (:mod:`.conversation`): ``input_audio_buffer.committed``, then
``conversation.item.added`` / ``.done``. Audio once committed or cleared never starts a turn later:
VAD events about it are ignored, so a client that appends a recorded sentence in a burst and
commits it by hand is not interrupted by its own sentence.

With server VAD (the default) the audio also streams to the pipeline's ASR session
(:mod:`.listen`); its typed events go to the turn core (:mod:`.turn`), which says
when a turn begins (``input_audio_buffer.speech_started``; the answer playing is cancelled or, opted
in, paused), when to prepare an answer ahead (held back until released) or drop it, and when the
turn ends (``input_audio_buffer.speech_stopped``, the commit, then the prepared answer released or
a response started; ``create_response`` false: the turn waits for ``response.create``).
``conversation.item.truncate`` of the answer playing ends it (:meth:`~.response.Response.truncate`).

A session opens with ``session.created`` then ``conversation.created`` (its one conversation).

With ``idle_timeout_ms``, a user silent that long after an answer has played gets
``input_audio_buffer.timeout_triggered``, the silence committed, and a response (:mod:`.idle`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import attrs
import trio

from omnitrio.serve.api_errors import as_api_error
from omnitrio.serve.context import ServeContext, new_id
from omnitrio.serve.realtime.answering import Answering
from omnitrio.serve.realtime.cascade import Cascade
from omnitrio.serve.realtime.conversation import Conversation, Item, client_item, user_audio_item
from omnitrio.serve.realtime.formats import EdgeAudio
from omnitrio.serve.realtime.idle import IdleTimeout
from omnitrio.serve.realtime.input_buffer import InputBuffer
from omnitrio.serve.realtime.listen import TurnListener
from omnitrio.serve.realtime.metrics import realtime_metrics
from omnitrio.serve.realtime.protocol import EventError, parse_event, wanted
from omnitrio.serve.realtime.response import Response, respond
from omnitrio.serve.realtime.response_create import requested_response
from omnitrio.serve.realtime.session_config import (
    TurnDetection,
    asked_voice,
    default_session,
    transcribes_input,
    turn_detection,
    updated_session,
)
from omnitrio.serve.realtime.speech_native import SpeechNative
from omnitrio.serve.realtime.transcribe import transcribe, transcript_of
from omnitrio.serve.realtime.transport import ClientAudio, ClientEvent, RealtimeTransport, Unreadable
from omnitrio.serve.realtime.turn import (
    MS,
    Began,
    Ended,
    Judged,
    Notice,
    Prepare,
    TurnOutput,
    Turns,
    TurnState,
    Unprepare,
    VadEvent,
)

OUTBOX_SIZE = 64
RELEASE_TIMEOUT = 10.0  # how long an interrupted response's release is watched, for the metric
ANSWERINGS: dict[str, type[Cascade | SpeechNative]] = {"cascade": Cascade, "speech-native": SpeechNative}
"""Each ``PipelineConfig.realtime_answer`` and the :class:`~.answering.Answering` it names."""
# OpenAI's words: LiveKit ignores this error by them (its cancel on speech_started races the server's own).
CANCEL_NOT_ACTIVE = "Cancellation failed: no active response found"


@attrs.define(eq=False)
class _Listening:
    """The current turn listener and where its stream starts in this session's input (samples)."""

    detection: TurnDetection
    base: int
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    listener: TurnListener = attrs.field(init=False)


class RealtimeSession:
    """One session: its configuration, conversation, turns, and in-flight and prepared responses.

    It runs over any :class:`~.transport.RealtimeTransport` (the WebSocket, WebRTC).
    """

    def __init__(self, ctx: ServeContext, transport: RealtimeTransport) -> None:
        self.ctx = ctx
        self.transport = transport
        self.answering: Answering = ANSWERINGS[ctx.realtime_answer](ctx)  # as the pipeline's config says
        self.lead = ctx.realtime_audio_lead
        self.metrics = realtime_metrics(ctx.pipeline.metrics_registry)
        self.session = default_session(new_id("sess"), ctx.pipeline.name)
        self.conversation = Conversation()
        self.edge = EdgeAudio()  # the client's audio formats (G.711 for telephony) to and from PCM16 24 kHz
        self.input = InputBuffer(ctx.limits.max_audio_seconds)
        self.turns = Turns(self.input, self._on_turn, partial(transcript_of, ctx))
        self.item_id = new_id("item")  # the id the next committed audio item will have
        self.speculative: Response | None = None  # prepared ahead of speech_stopped
        self.listening: _Listening | None = None
        self.idle = IdleTimeout(lambda: self.input.appended, self._idle_timeout)
        self.voice_asked: Any = "default"  # the voice name the client last set (what the pipeline is asked for)
        self._outbox, self._outbox_receive = trio.open_memory_channel[tuple[dict[str, Any], Response | None]](
            OUTBOX_SIZE
        )
        self._nursery: trio.Nursery | None = None

    @property
    def response(self) -> Response | None:
        """The released response in progress (the client has seen its ``response.created``)."""
        return self.turns.response

    async def run(self) -> None:
        """Serve until the client goes; then everything of this session is cancelled."""
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
            if response is not None and not response.plays(event["type"]):
                continue  # barge-in or truncation: audio of a silenced response is not played
            tail = self.edge.tail(event)
            if tail is not None and response is not None and response.plays(tail["type"]):
                await self.transport.send({"event_id": new_id("event"), **tail})
            outgoing = self.edge.outgoing(event, None if response is None else response.session)
            if outgoing is not None and wanted(outgoing, self.session):
                await self.transport.send(outgoing)
            if response is not None:
                response.on_sent(event["type"], self.metrics)

    async def _read_events(self) -> None:
        while (incoming := await self.transport.receive()) is not None:
            event: dict[str, Any] = {}
            try:
                match incoming:
                    case ClientEvent(text=text):
                        event = parse_event(text)
                        await self._apply(event)
                    case ClientAudio(pcm16=pcm16):
                        self._append(pcm16)
                    case Unreadable(message=message):
                        raise EventError(message, code="invalid_frame")
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
                self.session = updated_session(self.session, event.get("session"), stage_voices=self.ctx.stage_voices)
                self.edge.configure(self.session)
                self.voice_asked = asked
                if self.session.get("turn_detection") != before:
                    self._listen()
                await self.emit({"type": "session.updated", "session": self.session})
                if transcribes_input(self.session) and not self._can_transcribe():
                    await self._error(_no_transcription(self.ctx))
            case "input_audio_buffer.append":
                self._append(self.edge.incoming(event))
            case "input_audio_buffer.commit":
                if not self.input.audio:
                    raise EventError(
                        "the input audio buffer is empty; append audio before committing",
                        code="input_audio_buffer_commit_empty",
                    )
                await self._commit(self._take_input(self.input.end))
            case "input_audio_buffer.clear":
                self._take_input(self.input.end)
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
                if self.response is not None and self.response.item.id == fields["item_id"]:
                    self.response.truncate()  # the client keeps no more of it: none is sent
                await self.emit({"type": "conversation.item.truncated", **fields})
            case "response.create":
                self._start_response(event.get("response"))
            case "response.cancel":
                if self.response is None:
                    raise EventError(CANCEL_NOT_ACTIVE, code="response_cancel_not_active")
                self.response.interrupt("client_cancelled")
            case unknown:
                raise EventError(f"unknown event type {unknown!r}", "type", code="unknown_event")

    # -- input audio -----------------------------------------------------------------------

    def _append(self, data: bytes) -> None:
        self.input.append(data)
        if self.listening is not None:
            self.listening.listener.feed(data)
            # Only audio the VAD has judged silent may go: a burst sent faster than real time is
            # still unheard, and its speech must not lose its start.
            self.turns.heard(self.listening.base + self.listening.listener.heard)

    def _take_input(self, end: int, start: int | None = None) -> bytes:
        """The buffered input from ``start`` (default: the buffer's start) to ``end``, removed from the
        buffer; it starts no turn later, and a prepared answer and the current speech go with it."""
        audio = self.turns.take(end, start)
        self._drop_speculation()
        return audio

    def _turn_item(self, audio: bytes, heard: str | None = None) -> Item:
        """A user audio item for the next commit, its transcription started (``heard``: known already)."""
        item = user_audio_item(self.item_id, audio)
        item.heard = heard
        self._transcribe(item)
        return item

    def _transcribe(self, item: Item, *, report: bool | None = None) -> None:
        """Transcribe ``item`` when the answering needs it or the client asked (and the pipeline can);
        else it has no transcript (``transcribed`` set, ``heard`` None)."""
        assert self._nursery is not None
        report = transcribes_input(self.session) and self._can_transcribe() if report is None else report
        if not (report or self.answering.needs_transcripts):
            item.transcribed.set()
            return
        self._nursery.start_soon(partial(transcribe, self, item, report=report))

    def _can_transcribe(self) -> bool:
        """Whether the pipeline has an ASR stage for input transcription (it serves ``transcription``)."""
        return "transcription" in self.ctx.serves

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
        self.turns.reset()
        detection = turn_detection(self.session)
        if detection is None or detection.idle_timeout_ms is None:
            self.idle.disarm()
        if detection is None:
            return
        assert self._nursery is not None
        listening = _Listening(detection, self.input.appended)
        events_in, events = trio.open_memory_channel[VadEvent](float("inf"))
        listening.listener = TurnListener(
            self.ctx.pipeline, new_id("listen"), detection, events_in, timeout=self.ctx.request_timeout
        )
        self.listening = listening
        self._nursery.start_soon(self._run_listener, listening, events)

    async def _run_listener(self, listening: _Listening, events: trio.MemoryReceiveChannel[VadEvent]) -> None:
        """The listener and the turn core applying its events; the listener closes their channel when it ends."""
        with listening.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.turns.listen, listening.detection, listening.base, events)
                try:
                    await listening.listener.run()
                except Exception as exc:
                    error = as_api_error(exc)
                    if self.listening is listening:
                        self.listening = None
                    message = f"server turn detection stopped: {error.message}; commit input audio manually"
                    failure = {"type": error.type, "code": error.code, "message": message, "param": None}
                    await self.emit({"type": "error", "error": {**failure, "event_id": None}})

    async def _on_turn(self, out: TurnOutput) -> None:
        """Carry out what the turn core decided (see :mod:`.turn`)."""
        match out:
            case Began(audio_start_ms=ms):
                self.idle.disarm()
                self._drop_speculation()
                await self.emit(
                    {"type": "input_audio_buffer.speech_started", "audio_start_ms": ms, "item_id": self.item_id}
                )
            case Notice(event=event):
                await self.emit(event)
            case Prepare(audio=audio, heard=heard):
                self._drop_speculation()
                self.speculative = self._launch(Response(dict(self.session), self._turn_item(audio, heard), self.lead))
            case Unprepare():
                self._drop_speculation()
            case Judged(decision_ms=decision_ms):
                for part, spent_ms in decision_ms.items():
                    self.metrics.turn_decision.labels(part).observe(spent_ms / 1000)
            case Ended(audio_end_ms=ms, audio=audio, answer=answer):
                await self.emit(
                    {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms, "item_id": self.item_id}
                )
                prepared, self.speculative = self.speculative, None
                item = await self._commit(audio, prepared.turn if prepared is not None else None)
                if not answer:
                    if prepared is not None:
                        prepared.drop()
                elif prepared is not None:
                    self._release(prepared)
                else:
                    self._release(self._launch(Response(dict(self.session), item, self.lead)))

    def _drop_speculation(self) -> None:
        """Drop the prepared answer, and the transcription of the turn it was prepared for (never committed)."""
        if self.speculative is not None:
            self.speculative.drop()
            if self.speculative.turn is not None:
                self.speculative.turn.transcription.cancel()
            self.speculative = None

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
        self.turns.released(response)
        response.release()

    def finished(self, response: Response) -> None:
        """Called by the response once its work is over, before its ``.done`` events."""
        if self.response is response:
            self._arm_idle(response)
        self.turns.finished(response)
        if response.interrupted_at is not None and response.request_id is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self._watch_release, response)

    async def _watch_release(self, response: Response) -> None:
        """Time from the interruption until every stage has let the response's request go."""
        assert response.request_id is not None and response.interrupted_at is not None
        with trio.move_on_after(RELEASE_TIMEOUT):
            await self.answering.release(response.request_id)
            self.metrics.to_released.observe(trio.current_time() - response.interrupted_at)

    # -- idle timeout and voice ----------------------------------------------------------------

    def _arm_idle(self, response: Response) -> None:
        """With ``idle_timeout_ms``, start counting once the client has played ``response``'s audio."""
        detection = turn_detection(self.session)
        if detection is None or detection.idle_timeout_ms is None or self.turns.state is not TurnState.SILENT:
            return
        assert self._nursery is not None
        now = trio.current_time()
        self.idle.arm(self._nursery, now + response.held(now), detection.idle_timeout_ms / 1000)

    async def _idle_timeout(self, start: int) -> None:
        """No speech for ``idle_timeout_ms`` after the last answer played: commit the silence and answer."""
        end = self.input.appended
        span = {"audio_start_ms": start // MS, "audio_end_ms": end // MS, "item_id": self.item_id}
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


def _no_transcription(ctx: ServeContext) -> EventError:
    return EventError(
        f"input audio transcription needs an ASR stage, and pipeline {ctx.pipeline.name!r} has none (it does not"
        " serve 'transcription'; add an ASR stage and 'transcription' to its serves); the session goes on"
        " without input transcripts",
        "session.audio.input.transcription",
        code="transcription_not_served",
    )
