"""Qwen2.5-Omni's audio and image encoder stages: the thinker's towers, each alone with its own weights,
batched across requests.

* :class:`AudioTower`: ``Qwen2_5OmniAudioEncoder`` with the checkpoint's ``thinker.audio_tower.`` weights.
  Per request ``(input_features [n_clips, 128, T], feature_attention_mask [n_clips, T])`` →
  ``(audio_embeds [tokens, H], audio_feature_lengths [n_clips])``, the clips in order: what the thinker's
  ``get_audio_features`` gives for the same inputs (its ``last_hidden_state``).
* :class:`VisionTower`: ``Qwen2_5OmniVisionEncoder`` with the ``thinker.visual.`` weights.  Per request
  ``(pixel_values, image_grid_thw [n_images, 3])`` → ``image_embeds [tokens, H]``, what
  ``get_image_features`` gives (its ``pooler_output``, the images concatenated).

Requests batch *packed*, as the towers batch clips and images themselves: every clip (image) of every
request goes into one call along the sequence axis with its own length (grid), so attention stays within
each clip's chunks (image's windows), and the output is split back by token counts.

The stages (:func:`create_audio_encoder_stage`, :func:`create_image_encoder_stage`) take a batch of
:class:`~schedulers.front.handoffs.AudioEncoderInput` (``ImageEncoderInput``) and give each request
its :class:`~schedulers.front.handoffs.AudioEmbeddings` (``ImageEmbeddings``), batched as
:func:`schedulers.front.stages.create_encoder_stage` batches.

``device`` and ``dtype`` place each tower (:mod:`schedulers.devices`): it is built in ``dtype`` as
``from_pretrained`` builds it, filled from the checkpoint, moved to ``device``; inputs go there and outputs
come back on the CPU in float32 wherever it ran.  One thread at a time; every call runs under
``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniAudioEncoder,
    Qwen2_5OmniVisionEncoder,
)

from schedulers.devices import Placement, to_host
from schedulers.front.handoffs import ImageEmbeddings, ImageEncoderInput
from schedulers.front.stages import Batch, encoder_stage_factories, handoffs, pack_clips
from schedulers.front.towers import load_tower, run_vision
from schedulers.qwen2_5_omni.checkpoint import load_config, load_weights, preflight

AUDIO_PREFIX = "thinker.audio_tower."
VISION_PREFIX = "thinker.visual."


class AudioTower:
    """The thinker's audio tower alone (module docstring)."""

    def __init__(self, model_dir: str | Path, placement: Placement = Placement()) -> None:
        config = load_config(model_dir).thinker_config.audio_config
        self.placement = placement
        self.tower = load_tower(Qwen2_5OmniAudioEncoder, config, placement, load_weights, model_dir, AUDIO_PREFIX)

    def encode(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per ``(input_features, feature_attention_mask)``: ``(embeds [tokens, H], lengths [n_clips])``."""
        packed, lengths = pack_clips(requests)
        frames = torch.cat(lengths)
        after_cnn, tokens = self.tower._get_feat_extract_output_lengths(frames)
        put = self.placement.put
        with torch.inference_mode():
            encoded = self.tower(put(packed), feature_lens=put(frames), aftercnn_lens=put(after_cnn))
        out = to_host(encoded.last_hidden_state)
        per_request = [int(n.sum()) for n in tokens.split([len(clips) for clips in lengths])]
        return list(zip(torch.split(out, per_request), lengths, strict=True))


class VisionTower:
    """The thinker's vision tower alone (module docstring)."""

    def __init__(self, model_dir: str | Path, placement: Placement = Placement()) -> None:
        config = load_config(model_dir).thinker_config.vision_config
        self.placement = placement
        self.tower = load_tower(Qwen2_5OmniVisionEncoder, config, placement, load_weights, model_dir, VISION_PREFIX)
        self.merge = int(config.spatial_merge_size) ** 2

    def encode(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """Per ``(pixel_values, image_grid_thw)``: ``embeds [tokens, H]``."""
        out, tokens = run_vision(self.tower, self.placement, self.merge, requests)
        return list(torch.split(to_host(out.pooler_output), tokens))


def image_batch_fn(tower: VisionTower) -> Callable[[Batch], Batch]:
    """The image stage's batch compute: payloads in, the same payloads out holding their embeddings."""

    def encode_batch(payloads: Batch) -> Batch:
        inputs = handoffs(payloads, ImageEncoderInput, "image_encoder")
        outputs = tower.encode([(i.pixel_values, i.image_grid_thw) for i in inputs])
        for payload, given, embeds in zip(payloads, inputs, outputs, strict=True):
            payload.data = ImageEmbeddings(embeds, (), given.image_grid_thw, given.encoders)
        return payloads

    return encode_batch


create_audio_encoder_stage, create_image_encoder_stage = encoder_stage_factories(
    AudioTower, VisionTower, image_batch_fn, preflight
)
