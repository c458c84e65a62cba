"""The Qwen3-Omni thinker's language model: transformers' ``Qwen3OmniMoeThinkerTextModel`` and ``lm_head``.

Only the text model and the head are built and loaded (no audio tower, no vision encoder): the
encoder stages send their embeddings, and :meth:`ThinkerLM.prompt_inputs` puts them where
``Qwen3OmniMoeThinkerModel.forward`` puts them: audio features at the audio placeholder tokens, image
features at the image placeholder tokens (``masked_scatter``, in order), the deepstack features added
at the image positions after the first layers, and the 3-D multimodal rope positions from
transformers' own ``get_rope_index`` (called on the thinker config, no model needed).

A prompt's positions are ``[4, 1, P]`` as ``generate`` builds them (text positions, then temporal,
height, width); a token decoded later at cache length ``n`` has text position ``n`` and rope position
``n + rope_delta`` on all three axes, which is what ``generate`` feeds.

The model may sit on any device (``ThinkerLM.to``); inputs are moved to it, and what it returns stays
there.  Not thread-safe; every call runs under ``torch.inference_mode`` on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration,
    Qwen3OmniMoeThinkerTextModel,
    Qwen3OmniMoeThinkerTextRotaryEmbedding,
)

from schedulers.devices import build
from schedulers.engine.decoder import Decoded
from schedulers.engine.thinker_lm import ThinkerTextLM, check_rows

LoadFn = Callable[[str, nn.Module], None]
"""Fills a module built on the meta device from the checkpoint: ``load(prefix, module)``."""

TEXT_PREFIX = "thinker.model."
HEAD_PREFIX = "thinker.lm_head."


class _RopeIndex:
    """transformers' ``get_rope_index`` on a bare config (it reads only the config and two helpers)."""

    get_rope_index = Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index
    get_llm_pos_ids_for_vision = Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_llm_pos_ids_for_vision
    get_chunked_index = Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_chunked_index

    def __init__(self, thinker_config: Any) -> None:
        self.config = thinker_config
        self.spatial_merge_size = thinker_config.vision_config.spatial_merge_size


@attrs.frozen
class PromptInputs:
    """What the prefill forward of one request takes; ``embeds`` is ``hidden_states[0]`` of the prompt."""

    input_ids: torch.Tensor  # Long[P]
    embeds: torch.Tensor  # Float[P, H]
    position_ids: torch.Tensor  # [4, 1, P]
    rope_delta: int
    visual_pos_masks: torch.Tensor | None  # Bool[1, P]
    deepstack: list[torch.Tensor] | None  # each Float[n_image_tokens, H]


@attrs.frozen
class Prefill:
    """A prefill's outcome: the last position's logits, the keys/values, the hidden state the talker takes."""

    logits: torch.Tensor  # Float[V]
    cache: Cache  # the one it wrote: batch 1, P positions
    hidden: torch.Tensor | None  # Float[P, H] at accept_hidden_layer, when asked for


class ThinkerLM(ThinkerTextLM):
    """The text model and head of a Qwen3-Omni thinker (``config`` is the whole ``Qwen3OmniMoeConfig``)."""

    def __init__(self, config: Any, text_model: Qwen3OmniMoeThinkerTextModel, lm_head: nn.Linear) -> None:
        super().__init__(config, text_model, lm_head)
        self.accept_hidden_layer = int(config.talker_config.accept_hidden_layer)
        if not 0 <= self.accept_hidden_layer <= self.text_config.num_hidden_layers:
            raise ValueError(
                f"talker_config.accept_hidden_layer={self.accept_hidden_layer} must be in "
                f"[0, {self.text_config.num_hidden_layers}] (the thinker's layers)"
            )
        self._rope = _RopeIndex(self.thinker_config)

    def to(self, device: str | torch.device) -> ThinkerLM:
        """Move the model to ``device`` (in place); returns ``self``."""
        self.model.to(device)
        self.lm_head.to(device)
        return self

    @classmethod
    def build(cls, config: Any, load: LoadFn, *, dtype: torch.dtype = torch.float32) -> ThinkerLM:
        """Build on the meta device in ``dtype`` and let ``load`` fill it (prefixes :data:`TEXT_PREFIX`,
        :data:`HEAD_PREFIX`).  The rotary embedding's frequencies are not weights: they are computed again
        on the CPU."""
        text_config = config.thinker_config.text_config
        with torch.device("meta"):
            text_model = build(Qwen3OmniMoeThinkerTextModel, text_config, dtype)
            lm_head = nn.Linear(text_config.hidden_size, text_config.vocab_size, bias=False, dtype=dtype)
        text_model.rotary_emb = Qwen3OmniMoeThinkerTextRotaryEmbedding(text_model.config)
        load(TEXT_PREFIX, text_model)
        load(HEAD_PREFIX, lm_head)
        for name, tensor in [*text_model.named_parameters(), *text_model.named_buffers(), *lm_head.named_parameters()]:
            if tensor.is_meta:
                raise ValueError(f"thinker weights: {name} was not loaded from the checkpoint")
        return cls(config, text_model, lm_head)

    def prompt_inputs(
        self,
        input_ids: torch.Tensor,
        *,
        audio_embeds: torch.Tensor | None = None,
        image_embeds: torch.Tensor | None = None,
        deepstack_image_embeds: list[torch.Tensor] | None = None,
        image_grid_thw: torch.Tensor | None = None,
        audio_feature_lengths: torch.Tensor | None = None,
    ) -> PromptInputs:
        """The prompt's input embeddings and positions, as the thinker's forward builds them.

        ``audio_feature_lengths`` are the clips' mel-frame counts (``feature_attention_mask.sum(-1)``), as
        ``generate`` hands them to ``get_rope_index``.  A placeholder count that does not match the rows of
        the embeddings sent raises ``ValueError`` naming the field."""
        cfg = self.thinker_config
        ids = input_ids.reshape(1, -1).long().to(self.device)
        if int((ids == cfg.video_token_id).sum()):
            raise ValueError("input_ids: video placeholders are not supported by this thinker stage")
        with torch.inference_mode():
            embeds = self.model.embed_tokens(ids)
            audio_mask = ids == cfg.audio_token_id
            check_rows("audio_embeds", audio_embeds, int(audio_mask.sum()), self.hidden_size)
            if audio_embeds is not None and audio_embeds.shape[0]:
                embeds = embeds.masked_scatter(audio_mask.unsqueeze(-1), audio_embeds.to(embeds.device, embeds.dtype))
            image_mask = ids == cfg.image_token_id
            n_image = int(image_mask.sum())
            check_rows("image_embeds", image_embeds, n_image, self.hidden_size)
            visual_pos_masks, deepstack = None, None
            grid = self._image_grid(image_grid_thw, n_image, self._rope.spatial_merge_size)
            if n_image:
                assert image_embeds is not None
                embeds = embeds.masked_scatter(image_mask.unsqueeze(-1), image_embeds.to(embeds.device, embeds.dtype))
                visual_pos_masks = image_mask
                deepstack = [d.to(embeds.device, embeds.dtype) for d in deepstack_image_embeds or []]
                for i, d in enumerate(deepstack):
                    check_rows(f"deepstack_image_embeds[{i}]", d, n_image, self.hidden_size)
            lengths = audio_feature_lengths.to(self.device) if audio_feature_lengths is not None else None
            position_ids, rope_delta = self._positions(ids, grid, lengths)
        return PromptInputs(ids[0], embeds[0], position_ids, rope_delta, visual_pos_masks, deepstack)

    def _positions(
        self, ids: torch.Tensor, image_grid_thw: torch.Tensor | None, audio_feature_lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, int]:
        mask = torch.ones_like(ids)
        text = (mask.cumsum(-1) - 1)[None]
        rope_index: Any = self._rope  # duck-typed self for transformers' method
        rope, deltas = rope_index.get_rope_index(
            ids,
            image_grid_thw=image_grid_thw,
            video_grid_thw=None,
            attention_mask=mask,
            use_audio_in_video=False,
            audio_seqlens=audio_feature_lengths,
            second_per_grids=None,
        )
        return torch.cat([text, rope], dim=0), int(deltas.reshape(-1)[0])

    def prefill(self, prompt: PromptInputs, *, hidden: bool = True, cache: Cache | None = None) -> Prefill:
        """One request's prompt in one forward (batch 1); ``hidden``: also the accept-layer states.

        The keys/values go into ``cache`` (one empty row: a KV batch's prefill step) or a new ``DynamicCache``."""
        mask = torch.ones(1, prompt.embeds.shape[0], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out, cache = self._forward(
                prompt.embeds[None],
                prompt.position_ids,
                mask,
                cache,
                visual_pos_masks=prompt.visual_pos_masks,
                deepstack_visual_embeds=prompt.deepstack,
                output_hidden_states=hidden,
            )
            logits = self.lm_head(out.last_hidden_state[0, -1])
        states = out.hidden_states[self.accept_hidden_layer][0] if hidden else None
        return Prefill(logits, cache, states)

    def _decoded(self, hidden: torch.Tensor) -> Decoded:
        """The logits ``[B, V]`` (no states: the talker takes none per token)."""
        return Decoded(self.lm_head(hidden))
