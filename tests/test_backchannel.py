"""False interruptions: a backchannel or a wordless sound over the assistant resumes it; real speech cancels."""

from __future__ import annotations

import re

import pytest
import trio

from omnitrio.serve.realtime.backchannel import FalseInterruptions, InterruptionPolicy, words_of
from omnitrio.serve.realtime.pacing import Pacer


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
