"""How the thinker picks its next token: what ``generate`` does with the thinker's generation config.

``Qwen3OmniMoeForConditionalGeneration.generate`` runs ``thinker.generate`` with the thinker's own
generation config (built from its model config: greedy unless told otherwise) and the ``thinker_*``
keyword arguments.  :class:`SamplingDefaults` holds those knobs; a request's ``temperature`` overrides
them: ``0`` is greedy, above ``0`` samples at that temperature with the defaults' ``top_k`` / ``top_p``.
A repetition penalty, when the defaults have one, applies to greedy and sampled choices alike, over the
prompt and the tokens so far, as transformers' ``RepetitionPenaltyLogitsProcessor`` does.
"""

from __future__ import annotations

from typing import Any, cast

import attrs
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@attrs.frozen
class SamplingDefaults:
    """The thinker's sampling when a request does not say (``do_sample=False``: greedy)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None

    @classmethod
    def of(cls, generation_config: GenerationConfig | None, **overrides: Any) -> SamplingDefaults:
        """The knobs ``generate`` would use from ``generation_config`` (None: a default one), then ``overrides``."""
        gc = generation_config or GenerationConfig()
        knobs = {
            "do_sample": bool(gc.do_sample),
            "temperature": 1.0 if gc.temperature is None else float(gc.temperature),
            "top_k": gc.top_k,
            "top_p": gc.top_p,
            "repetition_penalty": gc.repetition_penalty,
        }
        knobs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**knobs)


@attrs.frozen
class Sampler:
    """One request's choice rule; ``temperature == 0`` (or defaults without sampling) is greedy."""

    greedy: bool
    processors: LogitsProcessorList
    generator: torch.Generator | None = None

    @classmethod
    def build(cls, defaults: SamplingDefaults, temperature: float | None, seed: int | None = None) -> Sampler:
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        greedy = temperature == 0 or (temperature is None and not defaults.do_sample)
        processors = LogitsProcessorList()
        if defaults.repetition_penalty not in (None, 1.0):
            processors.append(RepetitionPenaltyLogitsProcessor(float(defaults.repetition_penalty)))  # type: ignore[arg-type]
        if not greedy:
            temp = defaults.temperature if temperature is None else temperature
            if temp != 1.0:
                processors.append(TemperatureLogitsWarper(temp))
            if defaults.top_k:
                processors.append(TopKLogitsWarper(int(defaults.top_k)))
            if defaults.top_p is not None and defaults.top_p < 1.0:
                processors.append(TopPLogitsWarper(float(defaults.top_p)))
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return cls(greedy, processors, generator)

    def choose(self, logits: torch.Tensor, seen: list[int]) -> int:
        """The next token from ``logits`` ``[V]`` after the ids ``seen`` (prompt and output so far)."""
        scores = logits.float()[None]
        if self.processors:
            scores = self.processors(cast(torch.LongTensor, torch.tensor([seen], dtype=torch.long)), scores)
        if self.greedy:
            return int(scores[0].argmax())
        probs = torch.softmax(scores[0], dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))
