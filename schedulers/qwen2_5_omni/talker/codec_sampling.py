"""How the talker picks its next code, as ``Qwen2_5OmniForConditionalGeneration.generate`` has it picked.

``generate`` runs ``talker.generate`` with ``repetition_penalty=1.05``, ``suppress_tokens=[codec_bos]`` and
``eos_token_id=[codec_pad, codec_end]``; sampling (its default) adds temperature 0.9, top-k 40 and top-p 0.8;
``talker_min_new_tokens`` keeps both end codes out until that many codes were chosen.
:class:`CodecSampler` applies transformers' own logits processors in ``generate``'s order: the repetition
penalty over every id of the talker's sequence so far (the prompt's codec mask, pad and bos ids, then the
codes), the codec bos suppressed, then (sampling) temperature, top-k and top-p, then argmax or a draw.  A
code in :attr:`CodecSampler.ends` ends the speech; it is not a code of the answer.

Greedy choices are ``generate``'s for the same logits.  Sampled ones draw from the request's own CPU
generator (seeded: reproducible for a seed, not ``generate``'s draws).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import attrs
import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from schedulers.engine.sampling import TalkerKnobs
from schedulers.qwen2_5_omni.talker.model import TalkerModel


@attrs.frozen
class CodecSampling(TalkerKnobs):
    """One request's talker knobs: the kit's, with Qwen2.5-Omni's ``generate`` defaults (top-k 40, top-p 0.8)."""

    top_k: int = attrs.field(default=40, validator=attrs.validators.instance_of(int))
    top_p: float = attrs.field(default=0.8, converter=float)


class CodecSampler:
    """One request's code choice (module docstring); :meth:`choose` after each talker forward."""

    def __init__(self, model: TalkerModel, knobs: CodecSampling, seed: int | None = None) -> None:
        self.knobs = knobs
        self.ends = (model.codec_pad, model.codec_end)
        processors = LogitsProcessorList()
        if knobs.min_new_tokens:
            processors.append(_EndsHeldBack(self.ends, knobs.min_new_tokens, self))
        if knobs.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(knobs.repetition_penalty))
        processors.append(SuppressTokensLogitsProcessor([model.codec_bos], device="cpu"))
        if knobs.do_sample:
            if knobs.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(knobs.temperature))
            if knobs.top_k:
                processors.append(TopKLogitsWarper(knobs.top_k))
            if knobs.top_p < 1.0:
                processors.append(TopPLogitsWarper(knobs.top_p))
        self.processors = processors
        self.generator = torch.Generator().manual_seed(seed) if knobs.do_sample and seed is not None else None
        self._seen = [model.codec_mask, model.codec_pad, model.codec_bos]  # the prompt's ids, as a set
        self.codes: list[int] = []

    @property
    def done(self) -> bool:
        """An end code was chosen, or ``max_new_tokens`` choices were made."""
        return bool(self.codes) and (self.codes[-1] in self.ends or len(self.codes) >= self.knobs.max_new_tokens)

    def choose(self, logits: torch.Tensor) -> int:
        """The next code for the float32 ``logits [V]`` of the talker's last position; remembered for the
        penalty and returned (an end code included)."""
        scores = logits.reshape(1, -1).float().cpu()
        history = torch.tensor([self._seen], dtype=torch.long)
        scores = self.processors(cast(torch.LongTensor, history), scores)
        if self.knobs.do_sample:
            code = int(torch.multinomial(scores.softmax(dim=-1)[0], 1, generator=self.generator))
        else:
            code = int(scores[0].argmax())
        self.codes.append(code)
        if code not in self._seen:
            self._seen.append(code)
        return code


class _EndsHeldBack(LogitsProcessor):
    """``generate``'s ``MinNewTokensLengthLogitsProcessor`` for one request: the end codes' scores are
    ``-inf`` until ``count`` codes were chosen.  Its place in the list does not matter: ``-inf`` stays
    ``-inf`` under the repetition penalty and the suppression, and it comes before the warpers as there."""

    def __init__(self, ends: tuple[int, ...], count: int, sampler: CodecSampler) -> None:
        self.ends = list(ends)
        self.count = count
        self.sampler = sampler

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if len(self.sampler.codes) < self.count:
            scores = cast(torch.FloatTensor, scores.clone())
            scores[:, self.ends] = -float("inf")
        return scores


def choose_codes(samplers: Sequence[CodecSampler], logits: torch.Tensor) -> list[int]:
    """One code per row of ``logits [B, V]``, row ``b`` by ``samplers[b]``."""
    return [sampler.choose(row) for sampler, row in zip(samplers, logits, strict=True)]
