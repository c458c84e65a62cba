"""False interruptions: a backchannel or a wordless sound over the assistant resumes it; real speech cancels."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from omnitrio.messages import StreamMessage
from omnitrio.serve.realtime.backchannel import FalseInterruptions, InterruptionPolicy, words_of
from omnitrio.serve.realtime.interruption import JUDGE_TIMEOUT
from omnitrio.serve.realtime.listen import TurnListener
from omnitrio.serve.realtime.pacing import Pacer
from omnitrio.serve.realtime.response import ResponseState
from omnitrio.serve.realtime.session_config import turn_detection
from omnitrio.serve.realtime.turn import Heard, Notice, SpeechPaused, SpeechStarted, VadEvent
from tests.test_realtime_turn import RESUMING, core, playing, speech_over_the_answer


@pytest.mark.parametrize(
    "heard", [None, "", "  ", "...", "Uh-huh.", "mm hmm", "Mm-hmm, yeah.", "Okay!", "Oh, I see.", "Yeah, yeah, right."]
)
def test_backchannels_and_wordless_sounds_resume_the_response(heard: str | None) -> None:
    assert InterruptionPolicy().decide(heard) == "resume"


@pytest.mark.parametrize(
    "heard",
    ["Wait.", "Stop", "No, I meant Tuesday.", "Yeah, but what about the hotel?", "okay okay okay okay okay", "Hello?"],
)
def test_real_speech_cancels_the_response(heard: str) -> None:
    assert InterruptionPolicy().decide(heard) == "cancel"


def test_the_backchannel_list_is_a_setting() -> None:
    strict = InterruptionPolicy.from_settings(["uh-huh"])
    assert strict.decide("Uh huh") == "resume"
    assert strict.decide("yeah") == "cancel"
    assert strict.decide(None) == "resume"
    assert InterruptionPolicy.from_settings([]).decide("mm-hmm") == "cancel"
    assert InterruptionPolicy.from_settings(["go on"], max_words=2).decide("Go on, go on") == "cancel"


def test_bad_settings_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"backchannels\[1\]"):
        InterruptionPolicy.from_settings(["yeah", ""])
    with pytest.raises(ValueError, match="list of phrases"):
        InterruptionPolicy.from_settings("yeah")
    with pytest.raises(ValueError, match="max_words"):
        InterruptionPolicy.from_settings(None, max_words=0)


def test_spelling_is_normalised() -> None:
    assert words_of("Mm-hmm, OK!") == ("mm", "hmm", "ok")


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"decide_ms": 0}, "decide_ms"),
        ({"decide_ms": "1s"}, "decide_ms"),
        ({"backchannels": "uh-huh"}, "backchannels"),
        ({"backchannels": ["ok", ""]}, "backchannels[1]"),
        ({"max_words": 0}, "max_words"),
        ({"window": 500}, "window"),
        ("on", "object"),
    ],
)
def test_a_bad_false_interruption_setting_names_its_field(settings: object, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        FalseInterruptions.from_settings(settings)


def test_false_interruption_settings_keep_what_was_given() -> None:
    settings = FalseInterruptions.from_settings({"decide_ms": 600, "backchannels": ["uh-huh"]})
    assert settings.decide_ms == 600 and settings.policy.decide("yeah") == "cancel"
    assert FalseInterruptions.from_settings({}) == FalseInterruptions()


async def test_a_paused_pacer_sends_nothing_until_resumed_and_playback_skips_the_pause(autojump_clock: object) -> None:
    pacer = Pacer(lead=0.2)
    pacer.sent(2 * 24_000)  # one second of audio sent: the player holds it
    await trio.sleep(0.3)
    pacer.pause()
    held = pacer.held(trio.current_time())
    sent = trio.Event()

    async def send_next() -> None:
        await pacer.wait_to_send()
        sent.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_next)
        await trio.sleep(2.0)  # long past when the piece would have gone
        assert not sent.is_set() and pacer.held(trio.current_time()) == held
        pacer.resume()
        await trio.sleep(held - pacer.lead + 0.05)
        assert sent.is_set()


@pytest.mark.parametrize(
    "heard", ["Okay.", "okay", "OK", "OK.", "Ok", "ok!", "Okay?", "O.K.", " Okay. ", "Okay, okay."]
)
def test_every_way_the_recogniser_spells_okay_is_a_backchannel(heard: str) -> None:
    assert InterruptionPolicy().decide(heard) == "resume"


# -- the decide window counts the user's speech (audio), never how long hearing it took --------------

OVER = 100  # ms of the input where speech began over the answer (audio_start_ms, padded by prefix_padding_ms)
ONSET = OVER + RESUMING.prefix_padding_ms  # where the voice was detected: decide_ms counts from here
DECIDE_MS = FalseInterruptions().decide_ms  # RESUMING's
DETECTION = {"type": "semantic_vad", "eagerness": "auto", "false_interruptions": {}}  # as the client sets it


async def test_a_backchannel_heard_late_still_resumes_the_answer(autojump_clock: object) -> None:
    # The words of a short "Okay." come long after decide_ms of wall time (a slow recogniser on a busy CPU).
    c = core(said="Okay.")
    response = playing(c)
    async with speech_over_the_answer(c) as events:
        await trio.sleep(3 * DECIDE_MS / 1000)
        assert response.state is ResponseState.PAUSED
        events.send_nowait(SpeechPaused(ONSET + 600, "Okay."))
    assert response.state is ResponseState.PLAYING
    assert any(isinstance(o, Notice) and o.event["type"].endswith("resumed") for o in c.out)


async def test_speech_heard_going_on_past_decide_ms_cancels_the_answer_at_once() -> None:
    c = core()
    response = playing(c)
    async with speech_over_the_answer(c) as events:
        events.send_nowait(Heard(ONSET + DECIDE_MS - 20))
        await trio.testing.wait_all_tasks_blocked()
        assert response.state is ResponseState.PAUSED  # not yet: the window still runs
        events.send_nowait(Heard(ONSET + DECIDE_MS + 20))
        await trio.testing.wait_all_tasks_blocked()
        assert response.state is ResponseState.SILENCED and c.turns.response is None


async def test_a_pause_after_decide_ms_of_speech_cancels_even_on_backchannel_words() -> None:
    c = core(said="Okay.")
    response = playing(c)
    async with speech_over_the_answer(c) as events:
        events.send_nowait(SpeechPaused(ONSET + DECIDE_MS + 300, "okay okay okay"))
    assert response.state is ResponseState.SILENCED


async def test_speech_never_judged_cancels_the_answer_after_the_judge_timeout(autojump_clock: object) -> None:
    c = core()
    response = playing(c)
    async with speech_over_the_answer(c):
        await trio.sleep(DECIDE_MS / 1000 + JUDGE_TIMEOUT - 0.1)
        assert response.state is ResponseState.PAUSED  # a recogniser that lags holds the answer
        await trio.sleep(0.2)
        assert response.state is ResponseState.SILENCED  # one that never answers does not hold it for ever


class OneTurnASR:
    """A stand-in ASR stage: the first append hears speech start 100 ms into it; every append is answered."""

    def __init__(self) -> None:
        self.appends = 0

    @asynccontextmanager
    async def stream(self, request_id: str, inputs: Any, **options: Any) -> AsyncIterator[AsyncIterator[Any]]:
        async def messages() -> AsyncIterator[Any]:
            if inputs["command"]["op"] == "append":
                self.appends += 1
                if self.appends == 1:
                    yield StreamMessage(
                        request_id, "stream_asr", 0, {"type": "speech_started", "audio_start_ms": 100}, "vad"
                    )

        yield messages()


async def test_the_listener_says_how_far_the_vad_has_heard_after_each_appends_events() -> None:
    detection = turn_detection({"turn_detection": DETECTION})
    assert detection is not None
    send, receive = trio.open_memory_channel[VadEvent](math.inf)
    listener = TurnListener(OneTurnASR(), "listen-test", detection, send)  # type: ignore[arg-type]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            listener.feed(bytes(2 * 24_000 // 2))  # 500 ms
            assert await receive.receive() == SpeechStarted(100)
            assert await receive.receive() == Heard(500)  # after the events of the audio it covers
            listener.feed(bytes(2 * 24_000 // 10))
            assert await receive.receive() == Heard(600)
            nursery.cancel_scope.cancel()
