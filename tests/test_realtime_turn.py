"""The turn core alone: typed VAD events in, what the session must do out, no socket and no model.

Offsets are ms of the session's input (the listener's stream starts at 0); the buffer holds 5 s of
silence, so every turn's audio is there to take.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
import trio.testing

from omnitrio.serve.realtime.backchannel import FalseInterruptions
from omnitrio.serve.realtime.input_buffer import InputBuffer
from omnitrio.serve.realtime.response import Response, ResponseState
from omnitrio.serve.realtime.session_config import TurnDetection, default_session, turn_detection
from omnitrio.serve.realtime.turn import (
    MS,
    Began,
    Ended,
    Notice,
    Prepare,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnJudged,
    TurnOutput,
    Turns,
    TurnState,
    Unprepare,
    VadEvent,
)

SESSION = default_session("sess_test", "fake")


def _server_vad() -> TurnDetection:
    detection = turn_detection(SESSION)
    assert detection is not None
    return detection


SERVER_VAD = _server_vad()
RESUMING = attrs.evolve(SERVER_VAD, false_interruptions=FalseInterruptions(decide_ms=1000))


@attrs.define
class Core:
    turns: Turns
    out: list[TurnOutput]
    heard: list[bytes]  # what the interruption judge was asked to transcribe


def core(said: str = "") -> Core:
    buffer = InputBuffer(60.0)
    buffer.append(bytes(2 * 5 * 24_000))
    out: list[TurnOutput] = []
    heard: list[bytes] = []

    async def emit(output: TurnOutput) -> None:
        out.append(output)

    async def transcribe(audio: bytes) -> str:
        heard.append(audio)
        return said

    return Core(Turns(buffer, emit, transcribe), out, heard)


def playing(c: Core) -> Response:
    """A released response the client is hearing."""
    response = Response(dict(SESSION), None, 0.5)
    response.release()
    c.turns.released(response)
    return response


async def feed(c: Core, events: Sequence[VadEvent], detection: TurnDetection = SERVER_VAD) -> list[TurnOutput]:
    send, receive = trio.open_memory_channel[VadEvent](math.inf)
    for event in events:
        send.send_nowait(event)
    send.close()
    await c.turns.listen(detection, 0, receive)
    return c.out


async def test_speech_then_its_stop_is_one_turn_with_its_audio_answered() -> None:
    out = await feed(core(), [SpeechStarted(200), SpeechStopped(1500)])
    assert out == [Began(200), Ended(1500, bytes(2 * 1300 * MS), answer=True)]


async def test_speech_right_where_a_turn_stopped_is_a_turn_of_its_own() -> None:
    c = core()
    out = await feed(c, [SpeechStarted(0), SpeechStopped(1000), SpeechStarted(1000), SpeechStopped(1800)])
    assert [type(o) for o in out] == [Began, Ended, Began, Ended]
    assert out[3] == Ended(1800, bytes(2 * 800 * MS), answer=True)


async def test_vad_events_about_committed_audio_start_no_turn() -> None:
    c = core()
    c.turns.take(2000 * MS)  # the client committed a burst by hand
    assert await feed(c, [SpeechStarted(100), SpeechPaused(900), SpeechStopped(1500)]) == []


async def test_a_pause_prepares_an_answer_and_resumed_speech_drops_it() -> None:
    out = await feed(core(), [SpeechStarted(0), SpeechPaused(700, "hello there"), SpeechResumed(800)])
    assert out == [Began(0), Prepare(bytes(2 * 700 * MS), "hello there"), Unprepare()]


async def test_an_unfinished_pause_or_an_incomplete_judgement_keeps_no_answer_ready() -> None:
    unfinished = SpeechPaused(700, "a table for", "ends on the preposition 'for'")
    out = await feed(core(), [SpeechStarted(0), unfinished, TurnJudged(800, complete=False)])
    assert not any(isinstance(o, Prepare) for o in out) and isinstance(out[-1], Unprepare)


async def test_without_create_response_a_turn_is_committed_and_not_answered() -> None:
    detection = attrs.evolve(SERVER_VAD, create_response=False)
    out = await feed(core(), [SpeechStarted(0), SpeechPaused(500), SpeechStopped(900)], detection)
    assert [type(o) for o in out] == [Began, Ended] and out[-1] == Ended(900, bytes(2 * 900 * MS), answer=False)


async def test_speech_over_an_answer_cancels_it_at_once_by_default() -> None:
    c = core()
    response = playing(c)
    out = await feed(c, [SpeechStarted(100)])
    assert out == [Began(100)]  # no extension event
    assert response.state is ResponseState.SILENCED and c.turns.response is None


async def test_opted_in_a_backchannel_over_an_answer_pauses_then_resumes_it_and_is_no_turn() -> None:
    c = core(said="Okay.")
    response = playing(c)
    out = await feed(c, [SpeechStarted(100), SpeechPaused(600), SpeechStopped(900)], RESUMING)
    kinds = [o.event["type"] if isinstance(o, Notice) else type(o).__name__ for o in out]
    assert kinds == ["Began", "omnitrio.output_audio_buffer.paused", "omnitrio.output_audio_buffer.resumed"]
    assert response.state is ResponseState.PLAYING and c.turns.state is TurnState.SILENT
    assert c.heard == [bytes(2 * 500 * MS)]  # the speech was judged from its start to the pause


async def test_opted_in_real_words_over_an_answer_cancel_it_and_become_the_turn() -> None:
    c = core(said="Wait, what about Tuesday?")
    response = playing(c)
    out = await feed(c, [SpeechStarted(100), SpeechPaused(600), SpeechStopped(900)], RESUMING)
    assert response.state is ResponseState.SILENCED
    assert isinstance(out[-1], Ended) and out[-1].answer


@asynccontextmanager
async def speech_over_the_answer(c: Core) -> AsyncIterator[trio.MemorySendChannel[VadEvent]]:
    """The core listening (resume opted in) with speech begun at 100 ms over its answer, applied;
    more events go to the channel yielded, closed on the way out."""
    send, receive = trio.open_memory_channel[VadEvent](math.inf)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.turns.listen, RESUMING, 0, receive)
        with send:
            send.send_nowait(SpeechStarted(100))
            await trio.testing.wait_all_tasks_blocked()
            yield send


async def test_a_truncated_answer_is_never_resumed_even_opted_in() -> None:
    c = core(said="Okay.")
    response = playing(c)
    async with speech_over_the_answer(c) as events:
        response.truncate()  # the client stopped playing it and cut its item
        events.send_nowait(SpeechPaused(600))
    assert response.state is ResponseState.SILENCED
    assert not any(isinstance(o, Notice) and o.event["type"].endswith("resumed") for o in c.out)
