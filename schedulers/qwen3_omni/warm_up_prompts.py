"""Placeholder prompts for Qwen3-Omni's warm-ups: a chat ``<|im_start|>user … <|im_end|> <|im_start|>assistant``
with nothing, a one-second audio clip or a small image in its user turn, as the aggregate would hand them
to the thinker (zero embeddings in the media's places, the media's rope inputs), each asking for
:data:`TOKENS` tokens, greedy unless asked.  Built from the checkpoint's config alone: no tokenizer, no encoder.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.handoffs import Knobs

TOKENS = 3
"""Tokens each warm-up request decodes."""
MEL_FRAMES = 100
"""The warm-up clip's mel frames (one second)."""


class WarmUpPrompts:
    """The thinker inputs of the warm-up requests (module docstring) for the checkpoint ``config``."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.thinker = config.thinker_config
        self.word = 11  # any id that is not a special token

    def _chat(self, media: list[int]) -> torch.Tensor:
        c = self.config
        user = [c.im_start_token_id, c.user_token_id, self.word, *media, self.word, c.im_end_token_id]
        return torch.tensor([*user, self.word, c.im_start_token_id, c.assistant_token_id, self.word])

    def _knobs(self, spoken: bool, sampled: bool = False) -> Knobs:
        return Knobs(max_new_tokens=TOKENS, temperature=None if sampled else 0.0, want_audio=spoken)

    def text(self, *, spoken: bool, sampled: bool = False) -> ThinkerInput:
        """``sampled``: the stage's default sampling instead of greedy."""
        return ThinkerInput(self._chat([]), self._knobs(spoken, sampled))

    def audio(self) -> ThinkerInput:
        t = self.thinker
        lengths = torch.tensor([MEL_FRAMES])
        n = int(_get_feat_extract_output_lengths(lengths)[0])
        ids = self._chat([t.audio_start_token_id, *[t.audio_token_id] * n, self.word])
        embeds = torch.zeros(n, t.text_config.hidden_size)
        return ThinkerInput(ids, self._knobs(True), audio_embeds=embeds, audio_feature_lengths=lengths)

    def image(self) -> ThinkerInput:
        t = self.thinker
        merge = t.vision_config.spatial_merge_size
        grid = torch.tensor([[1, 2 * merge, 2 * merge]])
        n = int(grid.prod()) // merge**2
        ids = self._chat([t.vision_start_token_id, *[t.image_token_id] * n, self.word])
        embeds = torch.zeros(n, t.text_config.hidden_size)
        layers = len(t.vision_config.deepstack_visual_indexes)
        deepstack = tuple(torch.zeros(n, t.text_config.hidden_size) for _ in range(layers))
        return ThinkerInput(
            ids, self._knobs(True), image_embeds=embeds, deepstack_image_embeds=deepstack, image_grid_thw=grid
        )
