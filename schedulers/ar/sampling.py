"""Choosing each row's next token: greedy, or sampled with temperature and nucleus (``top_p``).

Before either, :func:`penalize` applies OpenAI's penalties and biases to a row's logits: each
token's logit loses ``presence_penalty`` if the answer so far holds it and ``frequency_penalty``
times the number of times it does, and gains its ``logit_bias``; so a greedy row takes the argmax
of the adjusted logits.  A row with ``temperature == 0`` takes the argmax.  Otherwise logits are
divided by the temperature,
the smallest set of most likely tokens whose probabilities reach ``top_p`` is kept (always at
least the most likely one), and one is drawn with the row's own ``torch.Generator``: a request
seeded alike draws alike, whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import torch

_CANDIDATES: Final = 256


@attrs.frozen
class Penalties:
    """One row's adjustments (OpenAI's ``frequency_penalty``, ``presence_penalty``, ``logit_bias``)."""

    frequency: float = 0.0
    presence: float = 0.0
    bias: Mapping[int, float] = attrs.field(factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.frequency or self.presence or self.bias)


def penalize(logits: torch.Tensor, penalties: Sequence[Penalties], generated: Sequence[Sequence[int]]) -> torch.Tensor:
    """``logits [B, vocab]`` adjusted per row by ``penalties[row]`` over the ``generated[row]`` token ids
    (this answer's so far); the same tensor when no row has any, else a float32 copy."""
    if not any(p.active for p in penalties):
        return logits
    adjusted = logits.float().clone()
    vocab = adjusted.shape[-1]
    for row, (p, ids) in enumerate(zip(penalties, generated, strict=True)):
        if (p.frequency or p.presence) and ids:
            counts = torch.bincount(torch.tensor(list(ids)), minlength=vocab)[:vocab].float()
            adjusted[row] -= p.frequency * counts + p.presence * (counts > 0).float()
        if p.bias:
            adjusted[row, torch.tensor(list(p.bias))] += torch.tensor(list(p.bias.values()), dtype=adjusted.dtype)
    return adjusted


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
