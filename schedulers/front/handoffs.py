"""The front's handoffs that are the same for every Qwen omni family: what preprocess gives (generic in the
family's knobs), what the encoders take and the audio encoder gives.  A family's ``handoffs`` module
re-exports them beside its own (its knobs, its image embeddings, its thinker's input); the same promises
hold (a handoff is built once and never changed, its CPU tensors are read and not written, a consumer that
keeps one longer than the request copies it), and each pickles as a constructor call
(:func:`schedulers.handoff.handoff`).

Every one carries the request's ``encoders`` (the encoder stages it needs, in graph order), which the
aggregate's fan-in reads from whichever input comes first (:mod:`schedulers.graph.front`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

from schedulers.handoff import handoff

if TYPE_CHECKING:  # the annotations only: the graph's routing imports these classes without torch
    import torch

K = TypeVar("K")
"""A family's knobs (its ``handoffs.Knobs``)."""


@handoff
@attrs.frozen(eq=False)
class Preprocessed(Generic[K]):
    """``preprocess`` → the graph's projections (the family's ``graph`` splits it for the encoders and the
    aggregate).

    ``input_ids`` ``Long[P]``: the prompt with the media placeholders expanded; ``encoders``: the encoder
    stages this request needs, in graph order; ``knobs``: the family's knobs as the client asked.  Audio:
    ``input_features`` ``Float[clips, 128, T]`` and ``feature_attention_mask`` ``[clips, T]`` (both or
    neither); images: ``pixel_values`` ``Float[patches, D]`` and ``image_grid_thw`` ``Long[images, 3]``
    (both or neither)."""

    input_ids: torch.Tensor
    encoders: tuple[str, ...]
    knobs: K
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@handoff
@attrs.frozen(eq=False)
class PreprocessedText(Generic[K]):
    """``preprocess`` → ``aggregate`` (projected from :class:`Preprocessed`): the prompt's ``input_ids``,
    the request's ``encoders`` and its ``knobs``."""

    input_ids: torch.Tensor
    encoders: tuple[str, ...]
    knobs: K


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


__all__ = ["AudioEmbeddings", "AudioEncoderInput", "ImageEncoderInput", "Preprocessed", "PreprocessedText"]
