"""False interruptions: a backchannel or a wordless sound over the assistant resumes it; real speech cancels."""

from __future__ import annotations

import pytest

from omnitrio.serve.backchannel import InterruptionPolicy, words_of


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
