"""A turn's life in one place: what the session does with each VAD event, free of sockets and models.

:class:`Turns` holds a session's input buffer (:class:`~.input_buffer.InputBuffer`), the response
the client is hearing (the session tells it with :meth:`Turns.released` / :meth:`Turns.finished`)
and the state of the turn in progress (:class:`TurnState`). With server VAD on, :meth:`Turns.listen`
takes typed VAD events (:data:`VadEvent`, offsets in ms of the listener's stream) from a channel, in
order, and says what the session must do through its one ``emit`` callable (:data:`TurnOutput`):

* :class:`SpeechStarted` (not in committed audio): the turn opens; the response in progress, if any
  (and ``interrupt_response``), is cancelled at once, or with ``false_interruptions`` paused while the
  speech is judged (:mod:`.interruption`), *before* :class:`Began` is emitted, so no audio
  of it follows ``speech_started``;
* :class:`SpeechPaused`: :class:`Prepare` an answer to the turn so far, when nothing is playing,
  ``create_response`` is on and the words do not say the turn is unfinished; with a response paused
  over it, the speech is judged first (a backchannel resumes the response and is no turn: its audio
  is dropped and the turn closes);
* :class:`TurnJudged` incomplete, :class:`SpeechResumed`: :class:`Unprepare`;
* :class:`SpeechStopped`: :class:`Ended` with the turn's audio, taken from the buffer (consumed:
  it never starts a turn again) and whether to answer it now;
* :class:`Heard`: the VAD has judged the stream this far, so speech over a paused response that
  has not paused by then is still going on (past ``decide_ms`` of it, the response is cancelled).

Speech resumed while no turn is open but a response plays (it was resumed over a backchannel) opens
a turn, as a start does. VAD events about audio that was committed or cleared are ignored, so a
hand-committed burst never interrupts its own answer. ``emit`` is awaited for each output in
order, before the next event is applied; cancelling :meth:`listen` (the session replaces its
listener when turn detection changes) stops it between two events or inside an ``emit``.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from omnitrio.serve.audio import REALTIME_RATE
from omnitrio.serve.realtime.input_buffer import InputBuffer
from omnitrio.serve.realtime.interruption import Interruptions
from omnitrio.serve.realtime.response import Response
from omnitrio.serve.realtime.session_config import TurnDetection

MS = REALTIME_RATE // 1000  # samples per millisecond at the API rate
IDLE_KEEP_SAMPLES = 5 * REALTIME_RATE  # with server VAD, heard input older than this is dropped between turns


# -- VAD events in (offsets: ms of the listener's audio stream) ---------------------------------


@attrs.frozen
class SpeechStarted:
    ms: int


@attrs.frozen
class SpeechPaused:
    """The turn may be ending; ``transcript`` (semantic_vad) is what it said so far, ``unfinished``
    the words' objection to ending it (None: none)."""

    ms: int
    transcript: str | None = None
    unfinished: str | None = None


@attrs.frozen
class SpeechResumed:
    ms: int


@attrs.frozen
class TurnJudged:
    ms: int
    complete: bool
    decision_ms: dict[str, float] = attrs.field(factory=dict)


@attrs.frozen
class SpeechStopped:
    ms: int


@attrs.frozen
class Heard:
    """The VAD has judged the stream up to ``ms``: every event about audio before it came already."""

    ms: int


VadEvent = SpeechStarted | SpeechPaused | SpeechResumed | TurnJudged | SpeechStopped | Heard


# -- what the session must do ---------------------------------------------------------------------


@attrs.frozen
class Began:
    """Speech began at ``audio_start_ms`` (of the session's input): ``speech_started``; drop what was prepared."""

    audio_start_ms: int


@attrs.frozen
class Prepare:
    """Prepare (silently) an answer to the turn so far: its audio, and its words when known already."""

    audio: bytes
    heard: str | None


@attrs.frozen
class Unprepare:
    """The prepared answer is stale: drop it."""


@attrs.frozen
class Ended:
    """The turn ended at ``audio_end_ms``: ``speech_stopped``, commit ``audio``; ``answer``: release the
    prepared answer (or start one), else drop it."""

    audio_end_ms: int
    audio: bytes
    answer: bool


@attrs.frozen
class Notice:
    """An extension event about the response the speech was over (paused / resumed)."""

    event: dict[str, Any]


@attrs.frozen
class Judged:
    """semantic_vad judged a pause; what the decision cost, per part (for the metrics)."""

    decision_ms: dict[str, float]


TurnOutput = Began | Prepare | Unprepare | Ended | Notice | Judged
Emit = Callable[[TurnOutput], Awaitable[None]]


class TurnState(enum.Enum):
    SILENT = "silent"  # no turn open
    SPEAKING = "speaking"  # speech started (or resumed); the turn goes on
    PAUSED = "paused"  # the turn may be ending: an answer may be prepared


class Turns:
    """One session's input and turn state (see the module docstring)."""

    def __init__(self, buffer: InputBuffer, emit: Emit, transcribe: Callable[[bytes], Awaitable[str]]) -> None:
        self.input = buffer
        self.emit = emit
        self.state = TurnState.SILENT
        self.response: Response | None = None  # released, not finished: what the client hears
        self._turn_start = 0  # input offset where the open turn began
        self.interruptions = Interruptions(transcribe, self._notice, self._cancel)

    # -- the session's side ------------------------------------------------------------------

    def released(self, response: Response) -> None:
        self.response = response

    def finished(self, response: Response) -> None:
        if self.response is response:
            self.response = None
        self.interruptions.forget(response)

    def heard(self, offset: int) -> None:
        """The VAD has judged the input up to ``offset``: between turns, older idle input may go."""
        if self.state is TurnState.SILENT and offset - IDLE_KEEP_SAMPLES > self.input.start:
            self.input.drop(offset - IDLE_KEEP_SAMPLES)

    def take(self, end: int, start: int | None = None) -> bytes:
        """The input from ``start`` to ``end`` (committed or cleared by hand, or by an idle timeout);
        a turn open in it is over."""
        self.state = TurnState.SILENT
        return self.input.take(end, start)

    def reset(self) -> None:
        """Turn detection changed: no turn is open."""
        self.state = TurnState.SILENT

    # -- server VAD ---------------------------------------------------------------------------

    async def listen(self, detection: TurnDetection, base: int, events: trio.MemoryReceiveChannel[VadEvent]) -> None:
        """Apply ``events`` (their ms counted from input offset ``base``) until the channel closes."""
        async with trio.open_nursery() as nursery:
            async for event in events:
                await self._apply(detection, base + MS * event.ms, event, nursery)
            nursery.cancel_scope.cancel()

    async def _apply(self, detection: TurnDetection, offset: int, event: VadEvent, nursery: trio.Nursery) -> None:
        fresh = offset >= self.input.consumed
        match event:
            case SpeechStarted() if fresh:  # the voice was detected prefix_padding_ms after the start
                await self._begin(detection, offset, offset + MS * detection.prefix_padding_ms, nursery)
            case SpeechResumed() if self.state is TurnState.SILENT and self.response is not None and fresh:
                await self._begin(detection, offset, offset, nursery)  # more speech over a resumed response
            case SpeechResumed():
                if self.state is TurnState.PAUSED:
                    self.state = TurnState.SPEAKING
                await self.emit(Unprepare())
            case SpeechPaused(transcript=transcript, unfinished=unfinished) if self.state is not TurnState.SILENT:
                self.state = TurnState.PAUSED
                if self.interruptions.pending is not None:
                    heard = self.input.span(self._turn_start, offset)
                    resumed = await self.interruptions.judge(heard, transcript, offset)
                    if resumed and self.state is not TurnState.SILENT:
                        self.take(offset, self._turn_start)  # a backchannel is no turn
                        return
                ready = self.response is None and self.state is not TurnState.SILENT and unfinished is None
                if detection.create_response and ready:
                    await self.emit(Prepare(self.input.span(self._turn_start, offset), transcript))
            case TurnJudged(complete=complete, decision_ms=decision_ms):
                await self.emit(Judged(decision_ms))
                if not complete:
                    await self.emit(Unprepare())  # the turn will likely go on: no answer kept ready meanwhile
            case SpeechStopped() if self.state is not TurnState.SILENT:
                audio = self.take(offset, self._turn_start)
                answer = detection.create_response and self.response is None
                await self.emit(Ended(offset // MS, audio, answer))
            case Heard():
                self.interruptions.heard(offset)

    async def _begin(self, detection: TurnDetection, offset: int, onset: int, nursery: trio.Nursery) -> None:
        """A turn opens at ``offset`` (its audio's start), the voice heard from ``onset``."""
        self.state = TurnState.SPEAKING
        self._turn_start = max(offset, self.input.start)
        paused = self._overhear(detection, onset, nursery)  # before the event, so no audio follows it
        await self.emit(Began(offset // MS))
        if paused is not None:
            await self.emit(Notice(paused))

    def _overhear(self, detection: TurnDetection, onset: int, nursery: trio.Nursery) -> dict[str, Any] | None:
        """User speech over the response: cancel it now, or (opted in) pause it to judge the speech."""
        response = self.response
        if response is None or not detection.interrupt_response:
            return None
        if detection.false_interruptions is None or not response.audio:
            self._cancel(response)
            return None
        return self.interruptions.overhear(response, detection.false_interruptions, onset, nursery).paused_event()

    def _cancel(self, response: Response) -> None:
        """A real interruption: the response is cancelled (its .done events follow) and no longer in
        progress, so the speech, going on as a turn, may be answered at once."""
        response.interrupt("turn_detected")
        if self.response is response:
            self.response = None

    async def _notice(self, event: dict[str, Any]) -> None:
        await self.emit(Notice(event))
