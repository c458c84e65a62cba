"""Where a small model's answer starts repeating itself (the responder cuts it there)."""

from __future__ import annotations

from schedulers.speech.repetition import repeat_start


def cut(text: str) -> str:
    at = repeat_start(text)
    return text if at is None else text[:at]


def test_a_repeated_sentence_or_list_item_is_cut_with_its_number() -> None:
    assert cut("Sleep well. Go to bed early. Sleep well. Rest.") == "Sleep well. Go to bed early."
    assert cut("Names:\n1. The Lunacy Cat\n2. The Lunacy Cat\n3.") == "Names:\n1. The Lunacy Cat\n"


def test_a_loop_without_a_sentence_end_is_cut_after_its_first_piece() -> None:
    text = "Sleep in a way that allows you to sleep in a way that allows you to sleep in a way that allows you"
    assert cut(text) == "Sleep in a way that allows you to sleep in a way that allows you"
    assert cut("I like cats and and and and") == "I like cats and"


def test_ordinary_answers_and_short_repeats_are_left_alone() -> None:
    ordinary = ["The capital of France is Paris.", "Yes. Yes. Yes.", "Well, well, well.", "ha ha ha", "1. Tea\n2. Milk"]
    for text in ordinary:
        assert repeat_start(text) is None
