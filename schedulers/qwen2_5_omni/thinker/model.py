"""The Qwen2.5-Omni thinker's language model: transformers' ``Qwen2_5OmniThinkerTextModel`` and ``lm_head``.

Only the text model and the head are built and loaded (``thinker.model.`` and ``thinker.lm_head.``): the
encoder stages send their embeddings, and :meth:`ThinkerLM.prompt_inputs` puts them where
``Qwen2_5OmniThinkerModel.forward`` puts them (audio features at the ``<|AUDIO|>`` tokens, image features
at the ``<|IMAGE|>`` tokens, in order) with the 3-D rope positions of transformers' own ``get_rope_index``
on the thinker config, fed as ``generate`` feeds them: ``[4, 1, P]``, the text positions then temporal,
height, width.  transformers computes the 3-D positions only when the request has an image; an audio or
text prompt has sequential positions on all three axes (rope delta 0).

A token decoded at cache length ``n`` has text position ``n`` and rope position ``n + rope_delta`` on every
axis, which is what ``generate`` feeds.  Besides the logits, every forward returns what ``generate`` hands
the talker: the last hidden state (after the final norm) of each position fed, and the prefill also its
input embeddings (a decode step's are the ones fed, :meth:`ThinkerLM.embed` of its tokens).

:meth:`ThinkerLM.decode` steps any rows of a batch through transformers' ``Cache`` interface (any cache
whose layers append one column per row, with an attention mask that hides each row's padding), so the
kit's KV batch can drive it: it is a :class:`schedulers.engine.decoder.DecoderLM`.  The model sits on one
device; inputs are moved to it, outputs stay there (logits float32).  Not thread-safe; every call runs
under ``torch.inference_mode``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniPreTrainedModelForConditionalGeneration as Model,
)
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniThinkerTextModel,
)

from schedulers.devices import build, uninitialised
from schedulers.engine.decoder import Decoded
from schedulers.engine.thinker_lm import ThinkerTextLM, check_rows
from schedulers.qwen2_5_omni.checkpoint import load_config, load_weights

TEXT_PREFIX = "thinker.model."
HEAD_PREFIX = "thinker.lm_head."


class _RopeIndex:
    """transformers' ``get_rope_index`` on a bare config (it reads only the config and two helpers)."""

    def __init__(self, thinker_config: Any) -> None:
        self.config = thinker_config
        self.spatial_merge_size = thinker_config.vision_config.spatial_merge_size
        self.get_rope_index = Model.get_rope_index.__get__(self)
        self.get_llm_pos_ids_for_vision = Model.get_llm_pos_ids_for_vision.__get__(self)
        self.get_chunked_index = Model.get_chunked_index.__get__(self)


@attrs.frozen(eq=False)
class PromptInputs:
    """What the prefill of one request takes."""

    input_ids: torch.Tensor  # Long[P]
    embeds: torch.Tensor  # Float[P, H]: token embeddings, audio/image features in place
    position_ids: torch.Tensor  # Long[4, 1, P]
    rope_delta: int


@attrs.frozen(eq=False)
class Prefill:
    """A prefill's outcome: the last position's logits, the keys/values, and per position the last hidden
    state and the input embedding (what ``generate`` hands the talker for the prompt)."""

    logits: torch.Tensor  # Float32[V]
    cache: Cache  # the one it wrote: batch 1, P positions
    hidden: torch.Tensor  # Float[P, H]
    embeds: torch.Tensor  # Float[P, H]


class ThinkerLM(ThinkerTextLM):
    """The text model and head of a Qwen2.5-Omni thinker (``config`` is the whole ``Qwen2_5OmniConfig``)."""

    def __init__(self, config: Any, text_model: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__(config, text_model, lm_head)
        self._rope = _RopeIndex(self.thinker_config)
        self._media = {
            "audio_embeds": int(self.thinker_config.audio_token_index),
            "image_embeds": int(self.thinker_config.image_token_index),
        }
        self._video = int(self.thinker_config.video_token_index)

    @classmethod
    def from_checkpoint(
        cls, model_dir: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> ThinkerLM:
        """Build in ``dtype`` without initialising weights, fill from :data:`TEXT_PREFIX` and
        :data:`HEAD_PREFIX` (only their shards are read), move to ``device``."""
        config = load_config(model_dir)
        text_config = config.thinker_config.text_config
        text_model = build(Qwen2_5OmniThinkerTextModel, text_config, dtype)  # safe beside other stages' builds
        with uninitialised():
            lm_head = nn.Linear(text_config.hidden_size, text_config.vocab_size, bias=False, dtype=dtype)
        load_weights(model_dir, TEXT_PREFIX, text_model)
        load_weights(model_dir, HEAD_PREFIX, lm_head)
        return cls(config, text_model.to(device), lm_head.to(device))

    @classmethod
    def from_model(cls, model: Any) -> ThinkerLM:
        """Share the thinker of an in-memory ``Qwen2_5OmniForConditionalGeneration`` (tests)."""
        thinker = model.thinker
        return cls(model.config, thinker.model.language_model, thinker.lm_head)

    @property
    def num_layers(self) -> int:
        return int(self.text_config.num_hidden_layers)

    def prompt_inputs(
        self,
        input_ids: torch.Tensor,
        *,
        audio_embeds: torch.Tensor | None = None,
        image_embeds: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        audio_feature_lengths: torch.Tensor | None = None,
    ) -> PromptInputs:
        """The prompt's input embeddings and positions, as the thinker's forward and ``generate`` build them.

        ``audio_feature_lengths`` are the clips' mel-frame counts (``feature_attention_mask.sum(-1)``).  A
        placeholder count that does not match the rows sent raises ``ValueError`` naming the field."""
        ids = input_ids.reshape(1, -1).long().to(self.device)
        if bool((ids == self._video).any()):
            raise ValueError("input_ids: video placeholders are not supported by this thinker")
        with torch.inference_mode():
            embeds = self.model.embed_tokens(ids)
            for field, features in (("audio_embeds", audio_embeds), ("image_embeds", image_embeds)):
                mask = ids == self._media[field]
                check_rows(field, features, int(mask.sum()), self.hidden_size)
                if features is not None and features.shape[0]:
                    embeds = embeds.masked_scatter(mask.unsqueeze(-1), features.to(embeds.device, embeds.dtype))
            n_image = int((ids == self._media["image_embeds"]).sum())
            grid = self._image_grid(image_grid_thw, n_image, self._rope.spatial_merge_size)
            lengths = audio_feature_lengths.to(self.device) if audio_feature_lengths is not None else None
            mask = torch.ones_like(ids)
            rope, deltas = self._rope.get_rope_index(ids, grid, None, mask, False, lengths, None)
        text = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1)
        return PromptInputs(ids[0], embeds[0], torch.cat([text, rope], dim=0), int(deltas.reshape(-1)[0]))

    def prefill(self, prompt: PromptInputs, *, hidden: bool = True, cache: Cache | None = None) -> Prefill:
        """One request's prompt in one forward (batch 1).  The keys/values go into ``cache`` (one empty row:
        a KV batch's prefill step) or a new ``DynamicCache``; the last hidden states come whatever
        ``hidden`` says (the forward computes them anyway)."""
        mask = torch.ones(1, prompt.embeds.shape[0], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out, cache = self._forward(prompt.embeds[None], prompt.position_ids, mask, cache)
            states = out.last_hidden_state[0]
            logits = self.lm_head(states[-1]).float()
        return Prefill(logits, cache, states, prompt.embeds)

    def _decoded(self, hidden: torch.Tensor) -> Decoded:
        """The logits ``[B, V]`` (float32) and each row's last hidden state ``[B, H]`` (what ``generate`` hands
        the talker for the token fed)."""
        return Decoded(self.lm_head(hidden).float(), hidden)
