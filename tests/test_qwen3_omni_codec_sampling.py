"""The talker's code choice applies transformers' own logits processors, in generate's order."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from schedulers.qwen3_omni.talker.codec_sampling import (
    TalkerSampling,
    first_codes,
    processed_scores,
    suppressed_mask,
    warped,
)

VOCAB, EOS = 1056, 34


def transformers_scores(logits: torch.Tensor, history: list[int], knob: TalkerSampling) -> torch.Tensor:
    suppressed = [i for i in range(VOCAB - 1024, VOCAB) if i != EOS]
    processors = LogitsProcessorList(
        [
            RepetitionPenaltyLogitsProcessor(knob.repetition_penalty),
            MinNewTokensLengthLogitsProcessor(0, knob.min_new_tokens, EOS),
            SuppressTokensLogitsProcessor(suppressed),
        ]
    )
    return processors(torch.tensor([history], dtype=torch.long).view(1, -1), logits.clone())


def test_first_code_scores_equal_generates_processors() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=generator) * 4
    histories = [[], [3, 7, 7, 12], [EOS - 3, 5]]
    knobs = [TalkerSampling(min_new_tokens=2), TalkerSampling(repetition_penalty=1.3), TalkerSampling()]
    ours = processed_scores(logits, histories, knobs, suppressed_mask(VOCAB, EOS), EOS)
    for row in range(3):
        theirs = transformers_scores(logits[row : row + 1], histories[row], knobs[row])[0]
        assert torch.equal(ours[row], theirs)


def test_greedy_first_code_is_the_argmax_of_those_scores() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    knob = TalkerSampling(do_sample=False, repetition_penalty=2.0)
    histories = [[int(logits[0, :32].argmax())], []]
    scores = processed_scores(logits, histories, [knob, knob], suppressed_mask(VOCAB, EOS), EOS)
    codes = first_codes(scores, [knob, knob], None)
    for row in range(2):
        assert codes[row] == int(transformers_scores(logits[row : row + 1], histories[row], knob)[0].argmax())


def test_sampling_filter_equals_generates_warpers() -> None:
    scores = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    for temperature, top_k, top_p in [(0.9, 50, 1.0), (1.0, 50, 0.8), (0.7, 5, 0.5)]:
        warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k)])
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        theirs = warpers(torch.zeros(1, 0, dtype=torch.long), scores.clone())[0]
        assert torch.equal(warped(scores[0], temperature, top_k, top_p), theirs)
