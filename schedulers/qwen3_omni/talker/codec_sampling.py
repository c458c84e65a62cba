"""Choosing codes from logits the way transformers' ``generate`` does for the talker and code predictor.

The talker's first code per frame (:func:`processed_scores`, then :func:`first_codes`): repetition penalty
over the request's earlier first codes, ``codec_eos`` forbidden before ``min_new_tokens``, the ids
``[vocab - 1024, vocab)`` other than ``codec_eos`` suppressed, then greedy (argmax) or temperature →
top-k → top-p sampling — the logits processors ``generate`` builds from
``Qwen3OmniMoeForConditionalGeneration.generate``'s talker arguments, in its order.  The code predictor's
codes (:func:`sample_rows`): greedy, or top-k 50 / top-p 0.8 at temperature 1, what the talker's
``prepare_inputs_for_generation`` asks of it.

Greedy rows are bit-for-bit ``generate``'s choice for the same logits; sampled rows draw from
``generator`` (one per scheduler, so a run is reproducible for a seed, not equal to ``generate``'s draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedulers.engine.sampling import TalkerKnobs

SUPPRESSED_TOP = 1024
"""``generate`` suppresses the talker's top 1024 ids (codec specials, speakers) except ``codec_eos``."""


TalkerSampling = TalkerKnobs
"""One request's talker sampling knobs: the kit's, whose defaults are Qwen3-Omni's ``generate``'s."""


CODE_PREDICTOR_TOP_K = 50
CODE_PREDICTOR_TOP_P = 0.8


def suppressed_mask(vocab_size: int, codec_eos: int) -> torch.Tensor:
    """Bool ``[vocab]``: True where ``generate`` forbids the talker's first code."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[max(vocab_size - SUPPRESSED_TOP, 0) :] = True
    mask[codec_eos] = False
    return mask


def processed_scores(
    logits: torch.Tensor,
    histories: Sequence[Sequence[int]],
    knobs: Sequence[TalkerSampling],
    suppressed: torch.Tensor,
    codec_eos: int,
) -> torch.Tensor:
    """``logits [B, V]`` after repetition penalty, ``min_new_tokens`` and suppression (row ``b``'s earlier
    first codes are ``histories[b]``): what greedy takes the argmax of."""
    rows = [row for row, history in enumerate(histories) for _ in history]
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    seen[rows, [code for history in histories for code in history]] = True
    penalty = torch.tensor([[knob.repetition_penalty] for knob in knobs], dtype=logits.dtype, device=logits.device)
    scores = torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    early = [
        row
        for row, (history, knob) in enumerate(zip(histories, knobs, strict=True))
        if len(history) < knob.min_new_tokens
    ]
    scores[early, codec_eos] = -float("inf")
    return scores.masked_fill(suppressed, -float("inf"))


def warped(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row's scores after temperature, top-k and top-p (what sampling draws from by softmax)."""
    scores = scores / temperature if temperature != 1.0 else scores.clone()
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1 - top_p
        remove[-1] = False
        scores = scores.masked_fill(remove.scatter(0, order, remove), -float("inf"))
    return scores


def first_codes(scores: torch.Tensor, knobs: Sequence[TalkerSampling], generator: torch.Generator | None) -> list[int]:
    """The talker's first code for each row of ``scores [B, V]`` (:func:`processed_scores` of its float32
    logits), per its knobs: the argmax, or a draw after temperature, top-k and top-p."""
    greedy = scores.argmax(dim=-1).tolist()
    return [
        _choose(scores[row], True, knob.temperature, knob.top_k, knob.top_p, generator)
        if knob.do_sample
        else greedy[row]
        for row, knob in enumerate(knobs)
    ]


def sample_rows(logits: torch.Tensor, greedy: Sequence[bool], generator: torch.Generator | None) -> torch.Tensor:
    """The code predictor's next code per row of ``logits [B, V]``: argmax, or its top-k/top-p draw."""
    if all(greedy):
        return logits.argmax(dim=-1)
    return torch.tensor(
        [
            _choose(logits[row], not is_greedy, 1.0, CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P, generator)
            for row, is_greedy in enumerate(greedy)
        ],
        device=logits.device,
    )


def _choose(
    scores: torch.Tensor,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> int:
    if not do_sample:
        return int(scores.argmax())
    probs = warped(scores, temperature, top_k, top_p).softmax(dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
