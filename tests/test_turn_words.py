"""What the words say: a transcript ending on a word that cannot end a sentence is not over."""

from __future__ import annotations

import pytest

from schedulers.speech.turn_end import judge, policy_for
from schedulers.speech.turn_words import unfinished_because


@pytest.mark.parametrize(
    ("transcript", "reason"),
    [
        ("I would like to book a table for", "preposition 'for'"),
        ("What is the capital of?", "preposition 'of'"),
        ("Can you tell me about the", "article 'the'"),
        ("I need milk and", "conjunction 'and'"),
        ("Please send it to my", "determiner 'my'"),
        ("Book a table for, um", "filler 'um'"),
        ("Set an alarm for seven in the...", "trails off"),
        ("Thank you very much,", "trails off"),
    ],
)
def test_unfinished_phrases_are_not_over(transcript: str, reason: str) -> None:
    found = unfinished_because(transcript)
    assert found is not None and reason in found


@pytest.mark.parametrize(
    "transcript",
    [
        "",
        "Thank you very much. Goodbye.",
        "Could you turn it off?",
        "Log in",
        "What is the capital of France?",
        "Uh-huh.",
        "The train leaves from platform 7, the library closes at 9.",
        "It costs $20.",
        "Meet me at 7:30",
    ],
)
def test_the_words_do_not_object_to_finished_or_particle_endings(transcript: str) -> None:
    assert unfinished_because(transcript) is None


def test_the_words_veto_and_the_audio_decides_the_rest() -> None:
    medium = policy_for("medium")
    vetoed = judge(medium, 0.99, "ends on the preposition 'for'")
    assert not vetoed.complete and vetoed.end_after_ms == medium.incomplete_silence_ms
    assert judge(medium, 0.6, None).complete
    doubted = judge(medium, 0.4, None)
    assert not doubted.complete and doubted.end_after_ms == medium.doubted_silence_ms
    assert judge(medium, None, None).complete  # the words alone, without objection


def test_the_audio_models_doubt_alone_waits_less_than_unfinished_words() -> None:
    for eagerness in ("low", "medium", "high"):
        policy = policy_for(eagerness)
        assert policy.complete_silence_ms < judge(policy, 0.05, None).end_after_ms <= policy.incomplete_silence_ms // 4


def test_eagerness_orders_threshold_and_silences() -> None:
    low, medium, high = policy_for("low"), policy_for("medium"), policy_for("high")
    assert policy_for("auto") == medium
    assert (low.incomplete_silence_ms, medium.incomplete_silence_ms, high.incomplete_silence_ms) == (8000, 4000, 2000)
    assert low.threshold > medium.threshold > high.threshold
    assert low.complete_silence_ms >= medium.complete_silence_ms >= high.complete_silence_ms
    assert not judge(low, 0.6, None).complete and judge(high, 0.4, None).complete
    with pytest.raises(ValueError, match="eagerness"):
        policy_for("eager")
