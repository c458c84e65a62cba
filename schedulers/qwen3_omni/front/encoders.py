"""Qwen3-Omni's audio and image encoders as batched stages (transformers' own towers, their weights only).

* Audio: ``Qwen3OmniMoeAudioEncoder`` with the checkpoint's ``thinker.audio_tower.`` weights.  Input
  :class:`~schedulers.front.handoffs.AudioEncoderInput`; output
  :class:`~schedulers.front.handoffs.AudioEmbeddings`, the clips in order, what
  ``thinker.get_audio_features`` gives for the same inputs.
* Image: ``Qwen3OmniMoeVisionEncoder`` with the ``thinker.visual.`` weights.  Input
  :class:`~schedulers.front.handoffs.ImageEncoderInput`; output
  :class:`~schedulers.front.handoffs.ImageEmbeddings`, as ``get_image_features``.

Requests batch the way SGLang-Omni batches them: *packed*, not padded.  Every clip (image) of every request
in a batch goes into one call along the sequence axis, with its own length (grid) so the towers' attention
stays within each clip's windows (image); the output is split back by token counts
(:func:`schedulers.front.stages.create_encoder_stage`: a lone request never waits for company).  Each stage
loads only its tower's weights and runs torch with one intra-op thread.  ``device`` and ``dtype`` place the
tower (:mod:`schedulers.devices`): it is built in ``dtype`` as ``from_pretrained`` builds it, the inputs go
to its device, and the outputs come back on the CPU in float32 wherever it ran.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeVisionEncoder,
    _get_feat_extract_output_lengths,
)

from schedulers.devices import Placement, to_host
from schedulers.front.handoffs import ImageEmbeddings, ImageEncoderInput
from schedulers.front.stages import Batch, encoder_stage_factories, handoffs, pack_clips
from schedulers.front.towers import load_tower, run_vision
from schedulers.qwen3_omni.checkpoint import load_config, load_weights, preflight

AUDIO_PREFIX = "thinker.audio_tower."
VISION_PREFIX = "thinker.visual."


class AudioTower:
    """The thinker's audio tower alone: :meth:`encode` maps requests' features to their embeddings."""

    def __init__(self, model_dir: str, placement: Placement = Placement()) -> None:
        config = load_config(model_dir).thinker_config.audio_config
        self.placement = placement
        self.tower = load_tower(Qwen3OmniMoeAudioEncoder, config, placement, load_weights, model_dir, AUDIO_PREFIX)

    def encode(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per ``(input_features, feature_attention_mask)``: ``(embeds [tokens, H], lengths [n_clips])``."""
        packed, lengths = pack_clips(requests)
        with torch.inference_mode():
            encoded = self.tower(self.placement.put(packed), feature_lens=self.placement.put(torch.cat(lengths)))
        out = to_host(encoded.last_hidden_state)
        tokens = [int(_get_feat_extract_output_lengths(n, self.tower.n_window).sum()) for n in lengths]
        return list(zip(torch.split(out, tokens), lengths, strict=True))


class VisionTower:
    """The thinker's vision tower alone: :meth:`encode` maps requests' pixels to embeddings + deepstack."""

    def __init__(self, model_dir: str, placement: Placement = Placement()) -> None:
        config = load_config(model_dir).thinker_config.vision_config
        self.placement = placement
        self.tower = load_tower(Qwen3OmniMoeVisionEncoder, config, placement, load_weights, model_dir, VISION_PREFIX)
        self.merge = config.spatial_merge_size**2

    def encode(
        self, requests: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Per ``(pixel_values, image_grid_thw)``: ``(embeds [tokens, H], deepstack [[tokens, H], ...])``."""
        out, tokens = run_vision(self.tower, self.placement, self.merge, requests)
        embeds = torch.split(to_host(out.pooler_output), tokens)
        deepstack = [torch.split(to_host(feature), tokens) for feature in out.deepstack_features]
        return [(embeds[i], [layer[i] for layer in deepstack]) for i in range(len(requests))]


def image_batch_fn(tower: VisionTower) -> Callable[[Batch], Batch]:
    """The stage's batch compute: payloads in, the same payloads out with the image outputs as data."""

    def encode_batch(payloads: Batch) -> Batch:
        inputs = handoffs(payloads, ImageEncoderInput, "image_encoder")
        outputs = tower.encode([(i.pixel_values, i.image_grid_thw) for i in inputs])
        for payload, given, (embeds, deepstack) in zip(payloads, inputs, outputs, strict=True):
            payload.data = ImageEmbeddings(embeds, tuple(deepstack), given.image_grid_thw, given.encoders)
        return payloads

    return encode_batch


create_audio_encoder_stage, create_image_encoder_stage = encoder_stage_factories(
    AudioTower, VisionTower, image_batch_fn, preflight
)
