"""Nucleus sampling draws only, and every one of, the most likely tokens that hold ``top_p`` of the mass."""

from __future__ import annotations

import math

import pytest
import torch

from schedulers.ar.sampling import Penalties, penalize, sample_rows

VOCAB = 4096


def draws(logits: torch.Tensor, top_p: float, n: int) -> set[int]:
    generator = torch.Generator().manual_seed(0)
    return {sample_rows(logits[None], [1.0], [top_p], [generator])[0] for _ in range(n)}


def logits_of(probs: dict[int, float], rest: float) -> torch.Tensor:
    """Logits whose softmax gives ``probs`` to the listed tokens and ``rest`` to every other one."""
    logits = torch.full((VOCAB,), math.log(rest))
    for token, p in probs.items():
        logits[token] = math.log(p)
    return logits


def test_a_peaked_distribution_samples_exactly_its_nucleus() -> None:
    rest = 0.01 / (VOCAB - 3)
    logits = logits_of({7: 0.5, 900: 0.3, 3000: 0.19}, rest)
    assert draws(logits, top_p=0.75, n=300) == {7, 900}  # 0.5 < 0.75 <= 0.8
    assert draws(logits, top_p=0.45, n=100) == {7}  # the most likely alone holds more than 0.45


@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_a_flat_distribution_keeps_a_nucleus_wider_than_any_shortlist(top_p: float) -> None:
    # Every token equally likely: the nucleus is the first ceil(top_p * VOCAB) of them in sorted order,
    # thousands of tokens, so sampling must not stop at a shortlist of the top few.
    drawn = draws(torch.zeros(VOCAB), top_p=top_p, n=3000)
    assert len(drawn) > 1000
    assert len(drawn) <= math.ceil(top_p * VOCAB)


def test_penalties_follow_openais_definition_over_the_answer_so_far() -> None:
    logits = torch.zeros(1, 8)
    adjusted = penalize(logits, [Penalties(frequency=0.5, presence=1.0, bias={6: 3.0})], [[2, 2, 2, 5]])
    expected = torch.zeros(8)
    expected[2] = -(1.0 + 0.5 * 3)
    expected[5] = -(1.0 + 0.5 * 1)
    expected[6] = 3.0
    assert torch.equal(adjusted[0], expected)


def test_a_logit_bias_of_minus_100_bans_the_greedy_choice() -> None:
    logits = logits_of({3: 0.9}, 0.1 / VOCAB)[None]
    banned = penalize(logits, [Penalties(bias={3: -100.0})], [[]])
    assert sample_rows(banned, [0.0], [1.0], [torch.Generator()]) != [3]
    assert sample_rows(logits, [0.0], [1.0], [torch.Generator()]) == [3]


def test_rows_without_penalties_are_left_as_they_are() -> None:
    logits = torch.randn(2, 16)
    assert penalize(logits, [Penalties(), Penalties()], [[1, 2], [3]]) is logits
