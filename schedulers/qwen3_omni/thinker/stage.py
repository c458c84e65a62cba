"""The thinker stage: the kit's continuous-batching decoder stage, streaming to the text decode and the talker.

The stage's lifecycle (admission, budget, sampling, abort, failures) is
:mod:`schedulers.engine.decoder_stage`'s; this module is Qwen3-Omni's half, :class:`Qwen3Thinker`.

A ``new_request`` payload's data is the aggregate's :class:`~schedulers.front.handoffs.ThinkerInput`
(at the pipeline's entry, ``{"raw_inputs": ThinkerInput}``).  What the scheduler sends, per request, in
this order (the classes of :mod:`schedulers.qwen3_omni.handoffs`):

* to ``talker_target``, only when the answer is spoken: first a ``TalkerPrompt``, then a ``TalkerToken``
  per generated token as soon as it is chosen;
* to ``decode_target``, a ``DecodeToken`` per generated token;
* the ``result``: the payload with a ``ThinkerResult`` as its data.

A request samples under a seed drawn from the stage's ``seed`` and its id (None: the global generator).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import torch
from transformers import GenerationConfig

from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.engine.decoder import Decoder, DecoderPrompt
from schedulers.engine.decoder_stage import Ask, DecoderScheduler, Send, Targets, entry_input, plain, request_seed
from schedulers.engine.handoffs import DecodeToken, FinishReason, ThinkerResult
from schedulers.engine.sampling import SamplingDefaults
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.checkpoint import load_config, load_weights, preflight, require_model_dir
from schedulers.qwen3_omni.handoffs import TalkerPrompt, TalkerToken
from schedulers.qwen3_omni.thinker.model import ThinkerLM
from schedulers.qwen3_omni.thinker.warm_up import thinker_warm_up
from schedulers.warm_up import with_warm_up

ThinkerScheduler = DecoderScheduler


@attrs.frozen
class Qwen3Thinker(Targets):
    """Qwen3-Omni's handoffs of the decoder stage (module docstring); tensors leave as CPU float32."""

    def read(self, request_id: str, payload: Any, lm: Any) -> Ask:
        given = entry_input("thinker", request_id, payload, ThinkerInput)
        deepstack = given.deepstack_image_embeds
        prompt = lm.prompt_inputs(
            given.input_ids,
            audio_embeds=given.audio_embeds,
            image_embeds=given.image_embeds,
            deepstack_image_embeds=None if deepstack is None else list(deepstack),
            image_grid_thw=given.image_grid_thw,
            audio_feature_lengths=given.audio_feature_lengths,
        )
        knobs = given.knobs
        seed = request_seed(self.seed, request_id)
        return Ask(prompt, given, knobs.max_new_tokens, knobs.temperature, seed, want_hidden=knobs.want_audio)

    def prefilled(self, ask: Ask, prompt: DecoderPrompt, hidden: torch.Tensor | None) -> list[Send]:
        given: ThinkerInput = ask.given
        if not given.knobs.want_audio or hidden is None:
            return []
        chunk = TalkerPrompt(
            plain(prompt.input_ids),
            plain(prompt.embeds, torch.float32),
            plain(hidden, torch.float32),
            speaker=given.knobs.speaker,
            talker=given.knobs.talker,
            image_grid_thw=plain(given.image_grid_thw),
            audio_feature_lengths=plain(given.audio_feature_lengths),
        )
        return [Send(self.talker_target, chunk, "thinker")]

    def forwarded(self, ask: Ask, hidden: torch.Tensor, embed: torch.Tensor) -> list[Send]:
        return []

    def token(self, ask: Ask, token_id: int, embed: torch.Tensor) -> list[Send]:
        want_audio = ask.given.knobs.want_audio
        sends = [Send(self.decode_target, DecodeToken(token_id, want_audio), "tokens")]
        if want_audio:
            sends.append(Send(self.talker_target, TalkerToken(token_id, plain(embed, torch.float32)), "thinker"))
        return sends

    def result(self, ask: Ask, token_ids: tuple[int, ...], prompt_len: int, reason: FinishReason) -> ThinkerResult:
        return ThinkerResult(token_ids, prompt_len, reason, ask.given.knobs.want_audio)


@checked_by(preflight)
def create_thinker_stage(
    *,
    model_dir: str | None = None,
    max_new_tokens: int = 1024,
    max_running_requests: int = 16,
    max_waiting_requests: int = 256,
    eos_token_id: int | None = None,
    decode_target: str = "decode",
    talker_target: str = "talker",
    seed: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> DecoderScheduler:
    """Stage factory: the checkpoint's thinker text model and head (nothing else is read) in ``dtype`` on
    ``device`` (:mod:`schedulers.devices`), one torch CPU thread; the stage's outputs are CPU float32
    tensors wherever the model runs.

    ``eos_token_id`` defaults to the checkpoint's ``im_end_token_id`` (what ``generate``'s
    ``thinker_eos_token_id`` is for the released model); a request without a temperature samples as the
    checkpoint's ``generation_config.json`` says, greedy when it says nothing
    (:mod:`schedulers.engine.sampling`)."""
    placement = Placement.of("thinker", device, dtype)
    torch.set_num_threads(1)
    model_dir = require_model_dir(model_dir)
    config = load_config(model_dir)
    load = functools.partial(load_weights, model_dir)
    lm = ThinkerLM.build(config, load, dtype=placement.dtype).to(placement.device)
    engine = Decoder(lm, max_running=max_running_requests, max_waiting=max_waiting_requests)
    eos = eos_token_id if eos_token_id is not None else int(config.im_end_token_id)
    generation = Path(model_dir) / "generation_config.json"
    sampling = SamplingDefaults.of(GenerationConfig.from_pretrained(model_dir) if generation.is_file() else None)
    scheduler = DecoderScheduler(
        engine,
        Qwen3Thinker(decode_target, talker_target, seed),
        eos_token_id=eos,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
    )
    return with_warm_up(scheduler, thinker_warm_up)
