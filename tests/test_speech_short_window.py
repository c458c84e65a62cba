"""Which short-window transcripts are distrusted (and decoded again on the full window)."""

from __future__ import annotations

import pytest

from schedulers.speech.short_window import degenerate, window_seconds


@pytest.mark.parametrize(
    "text",
    [
        "Hello? Hello? Hello?",
        "Stop please stop please",
        "The train to Boston leaves from platform 7. The train to Boston leaves",
        "la la la la la la la la la la la la la la la la la la la la la la la la la la",
    ],
)
def test_repeated_or_restarted_text_is_degenerate(text: str) -> None:
    assert degenerate(text)


@pytest.mark.parametrize(
    "text",
    [
        "Turn left at the second traffic light.",
        "Stop, please stop.",
        "The train to Boston leaves from platform 7. The library closes at 9. We need chairs for the room.",
        "",
    ],
)
def test_ordinary_sentences_are_trusted(text: str) -> None:
    assert not degenerate(text)


def test_the_window_covers_the_clip_plus_a_tail_and_never_less_than_the_minimum() -> None:
    assert window_seconds(16_000) == 6
    assert window_seconds(16_000 * 9) == 12
