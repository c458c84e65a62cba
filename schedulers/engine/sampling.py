"""How a decoder picks its next token, as transformers' ``generate`` does.

For example ``Qwen3OmniMoeForConditionalGeneration.generate`` runs ``thinker.generate`` with the thinker's own
generation config, built from its model config (greedy), not with the checkpoint's
``generation_config.json``.  So greedy is what ``generate`` does: a request with ``temperature: 0`` is
plain argmax, as ``generate(..., thinker_do_sample=False)`` is.  A request that names no temperature
follows :class:`SamplingDefaults`: the checkpoint's ``generation_config.json`` when it asks for sampling
(its ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``), else greedy.  A request with a
temperature above 0 samples at that temperature with the defaults' ``top_k`` / ``top_p`` /
``repetition_penalty``, applied by transformers' own logits processors in ``generate``'s order; the
penalty covers the prompt and the tokens so far, as in ``generate``.
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
    """The sampling when a request does not say (``do_sample=False``: greedy)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float | None = 1.0
    repetition_penalty: float | None = 1.0

    @classmethod
    def of(cls, generation_config: GenerationConfig | None, **overrides: Any) -> SamplingDefaults:
        """The knobs of ``generation_config`` (None: none set), unset ones filled as ``generate`` fills them."""
        fallback = GenerationConfig._get_default_generation_params()
        knobs: dict[str, Any] = {}
        for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty"):
            value = overrides.get(name, getattr(generation_config, name, None))
            knobs[name] = fallback[name] if value is None else value
        return cls(**knobs)


@attrs.frozen
class Sampler:
    """One request's choice rule; ``temperature == 0`` (or defaults without sampling) is plain argmax."""

    greedy: bool
    processors: LogitsProcessorList
    generator: torch.Generator | None = None

    @classmethod
    def build(cls, defaults: SamplingDefaults, temperature: float | None, seed: int | None = None) -> Sampler:
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0")
        greedy = temperature == 0 or (temperature is None and not defaults.do_sample)
        processors = LogitsProcessorList()
        if not greedy:
            if defaults.repetition_penalty not in (None, 1.0):
                processors.append(RepetitionPenaltyLogitsProcessor(float(defaults.repetition_penalty)))  # type: ignore[arg-type]
            temp = defaults.temperature if temperature is None else temperature
            if temp != 1.0:
                processors.append(TemperatureLogitsWarper(temp))
            if defaults.top_k:
                processors.append(TopKLogitsWarper(int(defaults.top_k)))
            if defaults.top_p is not None and defaults.top_p < 1.0:
                processors.append(TopPLogitsWarper(float(defaults.top_p)))
        generator = None if seed is None else torch.Generator().manual_seed(seed)  # generate's draws after manual_seed
        return cls(greedy, processors, generator)

    def choose(self, logits: torch.Tensor, seen: list[int]) -> int:
        """The next token from ``logits`` ``[V]`` after the ids ``seen`` (prompt and output so far)."""
        scores = logits.float()[None]
        if self.processors:
            history = torch.tensor([seen], dtype=torch.long, device=scores.device)
            scores = self.processors(cast(torch.LongTensor, history), scores)
        if self.greedy:
            return int(scores[0].argmax())
        probs = torch.softmax(scores[0], dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generator))


@attrs.frozen
class TalkerKnobs:
    """A talker's code-sampling knobs, ``generate``'s ``talker_*`` arguments, with Qwen3-Omni's defaults; a
    family whose ``generate`` has other defaults subclasses it with them.  Checked when built: a bad value is
    a ``ValueError`` naming the knob."""

    do_sample: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    temperature: float = attrs.field(default=0.9, converter=float)
    top_k: int = attrs.field(default=50, validator=attrs.validators.instance_of(int))
    top_p: float = attrs.field(default=1.0, converter=float)
    repetition_penalty: float = attrs.field(default=1.05, converter=float)
    max_new_tokens: int = attrs.field(default=4096, validator=attrs.validators.instance_of(int))
    min_new_tokens: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))

    def __attrs_post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"talker max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:  # above max_new_tokens is allowed: the cap wins, as in generate
            raise ValueError(f"talker min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"talker temperature must be > 0 when sampling, got {self.temperature}")
        if not self.repetition_penalty > 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"talker repetition_penalty must be > 0, top_k >= 0 and top_p in (0, 1]; got "
                f"{self.repetition_penalty}, {self.top_k}, {self.top_p}"
            )
