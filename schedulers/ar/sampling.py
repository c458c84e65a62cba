"""Choosing each row's next token: greedy, or sampled with temperature and nucleus (``top_p``).

A row with ``temperature == 0`` takes the argmax.  Otherwise logits are divided by the temperature,
the smallest set of most likely tokens whose probabilities reach ``top_p`` is kept (always at
least the most likely one), and one is drawn with the row's own ``torch.Generator``: a request
seeded alike draws alike, whatever else shares its batch.
"""

from __future__ import annotations

from typing import Final

import torch

_CANDIDATES: Final = 256


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], generators: list[torch.Generator]
) -> list[int]:
    """One token id per row of ``logits [B, vocab]``."""
    greedy = logits.argmax(-1).tolist()
    tokens = []
    for row, (temperature, top_p, generator) in enumerate(zip(temperatures, top_ps, generators, strict=True)):
        if temperature <= 0:
            tokens.append(int(greedy[row]))
            continue
        probs = torch.softmax(logits[row].float() / temperature, -1)
        if top_p < 1.0:
            sorted_probs, order = _most_likely(probs, top_p)
            keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # tokens before which mass < top_p
            sorted_probs = sorted_probs * keep
            choice = torch.multinomial(sorted_probs, 1, generator=generator)
            tokens.append(int(order[choice]))
        else:
            tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    return tokens


def _most_likely(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities in descending order with their token ids: the top few when they already hold
    ``top_p`` of the mass (the nucleus is among them), else the whole vocabulary."""
    if probs.numel() > _CANDIDATES:
        top = probs.topk(_CANDIDATES)
        if float(top.values.sum()) >= top_p:
            return top.values, top.indices
    return probs.sort(descending=True)
