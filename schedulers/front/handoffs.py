"""The front's handoffs that are the same for every Qwen omni family: what the encoders take and the audio
encoder gives.  A family's ``handoffs`` module re-exports them beside its own (its knobs, its
preprocess output, its image embeddings, its thinker's input); the same promises hold (a handoff is built
once and never changed, its CPU tensors are read and not written, a consumer that keeps one longer than
the request copies it), and each pickles as a constructor call (:func:`schedulers.handoff.handoff`).

Every one carries the request's ``encoders`` (the encoder stages it needs, in graph order), which the
aggregate's fan-in reads from whichever input comes first (:mod:`schedulers.graph.front`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from schedulers.handoff import handoff

if TYPE_CHECKING:  # the annotations only: the graph's routing imports these classes without torch
    import torch


@handoff
@attrs.frozen(eq=False)
class AudioEncoderInput:
    """→ ``audio_encoder`` (projected from the family's preprocess output): the clips' ``input_features``
    ``Float[clips, 128, T]`` and ``feature_attention_mask`` ``[clips, T]``, and the request's ``encoders``."""

    input_features: torch.Tensor
    feature_attention_mask: torch.Tensor
    encoders: tuple[str, ...]


@handoff
@attrs.frozen(eq=False)
class ImageEncoderInput:
    """→ ``image_encoder`` (projected from the family's preprocess output): the images' ``pixel_values``
    ``Float[patches, D]`` and ``image_grid_thw`` ``Long[images, 3]``, and the request's ``encoders``."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    encoders: tuple[str, ...]


@handoff
@attrs.frozen(eq=False)
class AudioEmbeddings:
    """``audio_encoder`` → ``aggregate``: ``audio_embeds`` ``Float[Na, H]`` (every clip's tokens in order,
    what the thinker's ``get_audio_features`` gives), ``audio_feature_lengths`` ``Long[clips]`` (mel frames
    per clip), and the request's ``encoders``."""

    audio_embeds: torch.Tensor
    audio_feature_lengths: torch.Tensor
    encoders: tuple[str, ...]


__all__ = ["AudioEmbeddings", "AudioEncoderInput", "ImageEncoderInput"]
