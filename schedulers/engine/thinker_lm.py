"""What every Qwen omni thinker's language model shares: the text model and its head on one device, the
token embeddings, one forward over transformers' ``Cache`` interface, a decode step's positions and the
checks of what the encoder stages send.

A family's ``thinker.model`` subclasses :class:`ThinkerTextLM` and adds how it builds and loads the model,
how the media's embeddings go into the prompt and what its prefill and decode return.  A prompt's
positions are ``[4, 1, P]`` (text positions, then temporal, height, width, from transformers'
``get_rope_index``); a token decoded later at cache length ``n`` has text position ``n`` and rope
position ``n + rope_delta`` on all three axes, which is what ``generate`` feeds.  Inputs are moved to the
model's device and what it returns stays there.  Not thread-safe; every forward runs under
``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache

from schedulers.engine.decoder import Decoded
from schedulers.engine.kv_batch import cached_forward


class ThinkerTextLM:
    """A thinker's text model and head (``config`` is the family's whole omni config)."""

    def __init__(self, config: Any, text_model: nn.Module, lm_head: nn.Linear) -> None:
        self.config = config
        self.thinker_config = config.thinker_config
        self.text_config = config.thinker_config.text_config
        self.model: Any = text_model.eval()
        self.lm_head = lm_head.eval()

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., H]`` of ``ids``."""
        with torch.inference_mode():
            return self.model.embed_tokens(ids.to(self.device))

    def _forward(
        self,
        embeds: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None,
        **extra: Any,
    ) -> tuple[Any, Cache]:
        """The text model on ``embeds [B, S, H]``; ``cache`` (a new ``DynamicCache`` when None) grows by
        ``S`` columns.  Returns the model's output and the cache; call it under ``torch.inference_mode``."""
        cache = DynamicCache(config=self.text_config) if cache is None else cache
        return cached_forward(self.model, embeds, position_ids, attention_mask, cache, **extra), cache

    def decode(
        self,
        embeds: torch.Tensor,
        lengths: Sequence[int],
        rope_deltas: Sequence[int],
        attention_mask: torch.Tensor | None,
        cache: Cache,
    ) -> Decoded:
        """Feed one token to each of ``B`` rows: its input embedding ``embeds`` ``[B, H]`` (:meth:`embed`),
        ``lengths[b]`` positions already in row b's cache, ``cache`` the rows' keys/values (it grows by one
        column per row).  ``attention_mask`` is ``[B, width + 1]`` (the cache's columns then the new token,
        0 on padding); None when no row has padding.  What it returns of each row's last hidden state
        ``[B, H]`` is the family's :meth:`_decoded`."""
        text = torch.tensor(list(lengths), dtype=torch.long, device=self.device).view(1, -1, 1)
        rope = text + torch.tensor(list(rope_deltas), dtype=torch.long, device=self.device).view(1, -1, 1)
        position_ids = torch.cat([text, rope.expand(3, -1, -1)], dim=0)
        mask = None if attention_mask is None else attention_mask.to(self.device)
        inputs = embeds.reshape(embeds.shape[0], 1, -1).to(self.device)
        with torch.inference_mode():
            out, _ = self._forward(inputs, position_ids, mask, cache)
            return self._decoded(out.last_hidden_state[:, -1])

    def _decoded(self, hidden: torch.Tensor) -> Decoded:
        """A decode step's outcome from the rows' last hidden states ``[B, H]`` (under inference mode)."""
        raise NotImplementedError

    def _image_grid(self, image_grid_thw: torch.Tensor | None, n_image: int, merge: int) -> torch.Tensor | None:
        """``image_grid_thw`` on the model's device when the prompt has ``n_image`` image placeholders (None
        without); ``ValueError`` when it is missing or gives another count of tokens (``merge``: the vision
        config's ``spatial_merge_size``)."""
        if not n_image:
            return None
        if image_grid_thw is None:
            raise ValueError("image_grid_thw: required with image placeholders in input_ids")
        expected = int(image_grid_thw.prod(-1).sum()) // merge**2
        if expected != n_image:
            raise ValueError(
                f"image_grid_thw: {image_grid_thw.tolist()} gives {expected} image tokens, "
                f"input_ids has {n_image} placeholders"
            )
        return image_grid_thw.to(self.device)


def check_rows(field: str, tensor: torch.Tensor | None, placeholders: int, hidden: int) -> None:
    """``ValueError`` naming ``field`` unless ``tensor`` has one ``[hidden]`` row per placeholder (None: 0)."""
    rows = 0 if tensor is None else int(tensor.shape[0])
    if rows != placeholders:
        raise ValueError(f"{field}: {rows} rows sent, input_ids has {placeholders} placeholder tokens for them")
    if tensor is not None and rows and (tensor.ndim != 2 or tensor.shape[1] != hidden):
        raise ValueError(f"{field}: shape {tuple(tensor.shape)} must be [{rows}, {hidden}] (the thinker's hidden size)")


__all__ = ["ThinkerTextLM", "check_rows"]
