"""The engine's admission: each refusal carries the error class and OpenAI code a caller relies on."""

from __future__ import annotations

import pytest

from omnitrio.contract import InvalidRequest, StageOverloaded
from schedulers.engine.admission import Admission, completion_budget

ADMISSION = Admission("toy engine", context_tokens=16, max_running=2, max_waiting=1, vocab_size=100)


def check(prompt: list[int], max_new_tokens: int, *, present: bool = False, waiting: int = 0, running: int = 0) -> None:
    ADMISSION.check("r", prompt, max_new_tokens, present=present, waiting=waiting, running=running)


@pytest.mark.parametrize(
    ("prompt", "max_new_tokens", "code", "param", "words"),
    [
        ([], 4, "invalid_value", "messages", "the prompt is empty"),
        ([1, 100], 4, "invalid_value", "messages", "token ids must be in [0, 100)"),
        ([1], 0, "invalid_value", "max_tokens", "max_new_tokens=0 must be >= 1"),
        ([1] * 10, 7, "context_length_exceeded", "messages", "maximum context length is 16 tokens"),
    ],
)
def test_the_callers_mistakes_are_invalid_requests_with_openai_codes(
    prompt: list[int], max_new_tokens: int, code: str, param: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check(prompt, max_new_tokens)
    assert (refused.value.code, refused.value.param) == (code, param)
    assert words in str(refused.value)


def test_a_request_that_exactly_fills_the_context_is_admitted() -> None:
    check([1] * 10, 6)


def test_the_context_error_counts_the_messages_and_the_completion() -> None:
    with pytest.raises(InvalidRequest, match=r"you requested 17 tokens \(10 in the messages, 7 in the completion\)"):
        check([1] * 10, 7)


def test_a_full_waiting_queue_is_stage_overloaded_and_free_running_places_do_not_count() -> None:
    check([1], 1, waiting=2, running=0)  # two of the three would start at the next step
    with pytest.raises(StageOverloaded, match="waiting queue is full"):
        check([1], 1, waiting=1, running=2)


def test_a_duplicate_id_is_not_the_callers_mistake() -> None:
    with pytest.raises(ValueError, match="already in the engine") as refused:
        check([1], 1, present=True)
    assert not isinstance(refused.value, InvalidRequest)


def test_the_answer_budget_is_what_was_asked_or_what_the_context_leaves() -> None:
    assert completion_budget(10, None, context=16, default=100) == 6
    assert completion_budget(10, None, context=16, default=3) == 3
    assert completion_budget(10, 50, context=100, default=3, cap=20) == 20
    with pytest.raises(InvalidRequest) as refused:
        completion_budget(10, 7, context=16, default=3)
    assert refused.value.code == "context_length_exceeded" and "7 in the completion" in str(refused.value)
    with pytest.raises(InvalidRequest) as refused:
        completion_budget(16, None, context=16, default=3)
    assert refused.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest) as refused:
        completion_budget(1, 0, context=16, default=3)
    assert refused.value.param == "max_tokens"
