"""Qwen2.5-Omni's thinker and text decode stages: the kit's decoder stage and text decode over its handoffs.

The thinker's lifecycle (continuous batching, admission, budget, sampling, abort, failures) is
:mod:`schedulers.engine.decoder_stage`'s; :class:`Qwen25Thinker` is the family's half.  A
``new_request`` payload's data is the aggregate's :class:`~schedulers.front.handoffs.ThinkerInput`
(at the pipeline's entry, ``{"raw_inputs": ThinkerInput}``).  Per request, in this order (the classes of
:mod:`schedulers.qwen2_5_omni.handoffs`):

* to ``talker_target``, only when the answer is spoken: a ``TalkerPrompt`` once the prompt is prefilled
  (its ids, last hidden states and input embeddings, the request's ``Voice``), then a ``TalkerToken`` per
  answer token the thinker forwarded (every generated token but the last, in order): what
  ``generate`` hands its talker;
* to ``decode_target``, a ``DecodeToken`` per generated token as soon as it is chosen;
* the ``result``: the payload with a ``ThinkerResult`` as its data.

Sampling follows ``generate``: ``temperature: 0`` is greedy; a temperature above 0 samples with
``thinker.generate``'s defaults (top-k 50) under the request's ``seed``, drawn as ``generate`` draws
after ``torch.manual_seed(seed)`` (:mod:`schedulers.engine.sampling`).  A request without a seed samples
under one drawn from the stage's ``seed`` and its id, or the process's generator when the stage has none;
its voice's seed (token2wav's noise) is the request's seed, else one drawn likewise (random without a
stage seed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import attrs
import torch

from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.engine.admission import FinishReason
from schedulers.engine.decoder import Decoder, DecoderPrompt
from schedulers.engine.decoder_stage import (
    Ask,
    DecoderScheduler,
    Send,
    Targets,
    decoder_warm_up,
    entry_input,
    plain,
    request_seed,
)
from schedulers.engine.handoffs import DecodeToken, ThinkerResult
from schedulers.engine.text_decode import TextDecodeScheduler, load_text_decode
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen2_5_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen2_5_omni.handoffs import TalkerPrompt, TalkerToken, Voice
from schedulers.qwen2_5_omni.thinker.model import ThinkerLM

_MEDIA = ("audio_embeds", "image_embeds", "image_grid_thw", "audio_feature_lengths")
"""The fields of a ThinkerInput that ThinkerLM.prompt_inputs takes by the same names."""


@attrs.frozen(eq=False)
class _Given:
    input: ThinkerInput
    voice: Voice | None  # None: the answer is not spoken


@attrs.frozen
class Qwen25Thinker(Targets):
    """Qwen2.5-Omni's handoffs of the decoder stage (module docstring); tensors leave on the CPU in the
    thinker's dtype."""

    def read(self, request_id: str, payload: Any, lm: Any) -> Ask:
        given = entry_input("thinker", request_id, payload, ThinkerInput)
        knobs = given.knobs
        seed = knobs.seed if knobs.seed is not None else request_seed(self.seed, request_id)
        voice = None
        if knobs.want_audio:
            if knobs.speaker is None:
                raise ValueError(f"thinker: request {request_id!r} wants audio but names no speaker")
            voice = Voice(knobs.speaker, random.getrandbits(31) if seed is None else seed, knobs.stream)
        prompt = lm.prompt_inputs(given.input_ids, **{name: getattr(given, name) for name in _MEDIA})
        return Ask(
            prompt, _Given(given, voice), knobs.max_new_tokens, knobs.temperature, seed, want_hidden=voice is not None
        )

    def prefilled(self, ask: Ask, prompt: DecoderPrompt, hidden: torch.Tensor | None) -> list[Send]:
        voice = ask.given.voice
        if voice is None or hidden is None:
            return []
        chunk = TalkerPrompt(plain(prompt.input_ids), plain(hidden), plain(prompt.embeds), voice)
        return [Send(self.talker_target, chunk, "thinker")]

    def forwarded(self, ask: Ask, hidden: torch.Tensor, embed: torch.Tensor) -> list[Send]:
        if ask.given.voice is None:
            return []
        return [Send(self.talker_target, TalkerToken(plain(hidden), plain(embed.reshape(-1))), "thinker")]

    def token(self, ask: Ask, token_id: int, embed: torch.Tensor) -> list[Send]:
        return [Send(self.decode_target, DecodeToken(token_id, ask.given.voice is not None), "tokens")]

    def result(self, ask: Ask, token_ids: tuple[int, ...], prompt_len: int, reason: FinishReason) -> ThinkerResult:
        return ThinkerResult(token_ids, prompt_len, reason, ask.given.voice is not None)


@checked_by(preflight)
def create_thinker_stage(
    *,
    model_dir: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    warm_up: bool = True,
    max_new_tokens: int = 1024,
    max_running_requests: int = 16,
    max_waiting_requests: int = 256,
    eos_token_id: int | None = None,
    seed: int | None = None,
    decode_target: str = "decode",
    talker_target: str = "talker",
) -> DecoderScheduler:
    """Stage factory: the checkpoint's thinker text model and head (nothing else is read) in ``dtype`` on
    ``device`` (:mod:`schedulers.devices`).

    ``eos_token_id`` defaults to the thinker's (``thinker_config.text_config.eos_token_id``, what
    ``thinker.generate`` stops on); a request without a temperature is greedy, as ``generate`` is.
    ``warm_up``: one prefill and decode on the serving thread before the stage reports ready."""
    placement = Placement.of("thinker", device, dtype)
    lm = ThinkerLM.from_checkpoint(require_model_dir(model_dir), device=str(placement.device), dtype=placement.dtype)
    engine: Decoder[ThinkerLM] = Decoder(lm, max_running=max_running_requests, max_waiting=max_waiting_requests)
    eos = eos_token_id if eos_token_id is not None else int(lm.text_config.eos_token_id)
    warm = decoder_warm_up(engine, lm.prompt_inputs(torch.tensor([eos] * 4))) if warm_up else None
    family = Qwen25Thinker(decode_target, talker_target, seed)
    return DecoderScheduler(engine, family, eos_token_id=eos, max_new_tokens=max_new_tokens, warm_up=warm)


@checked_by(preflight)
def create_decode_stage(*, model_dir: str | Path | None = None) -> TextDecodeScheduler:
    """Stage factory: the text decode over the checkpoint's tokenizer (``model_dir``), special tokens skipped."""
    return load_text_decode(require_model_dir(model_dir), token_type=DecodeToken, result_type=ThinkerResult)
