"""The front's handoffs that are the same for every Qwen omni family: what preprocess gives, what the encoders
take and give, and what the aggregate gives the thinker (those that carry knobs are generic in the
family's :class:`Knobs`, its ``handoffs.Knobs``).  A family's ``handoffs`` module holds the rest of its
edges (its knobs, its thinker → talker → vocoder edges); the same promises
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


@handoff
@attrs.frozen(eq=False)
class ImageEmbeddings:
    """``image_encoder`` → ``aggregate``: ``image_embeds`` ``Float[Ni, H]`` (every image's tokens in order,
    what the thinker's ``get_image_features`` gives), one ``Float[Ni, H]`` per deepstack layer (none for a
    family whose vision tower has no deepstack: Qwen2.5-Omni), the ``image_grid_thw`` they came from, and
    the request's ``encoders``."""

    image_embeds: torch.Tensor
    deepstack_image_embeds: tuple[torch.Tensor, ...]
    image_grid_thw: torch.Tensor
    encoders: tuple[str, ...]


@handoff
@attrs.frozen(eq=False)
class ThinkerInput(Generic[K]):
    """``aggregate`` (the family's ``merge_fn``, ``.graph:EDGES.merge_aggregate``) → ``thinker``; also what a
    caller submits to a pipeline that starts at the thinker.

    ``input_ids`` ``Long[P]`` with one audio (image) placeholder per row of ``audio_embeds`` ``Float[Na, H]``
    (``image_embeds`` ``Float[Ni, H]``), in order, as the encoders made them: the thinker places them and
    computes the 3-D rope positions from ``input_ids``, ``image_grid_thw`` ``Long[images, 3]`` and
    ``audio_feature_lengths`` ``Long[clips]`` (mel frames per clip).  ``deepstack_image_embeds``: the
    vision tower's deepstack layers (None for a family without them).  A medium the request does not have
    is None.  ``knobs``: the family's knobs as the client asked."""

    input_ids: torch.Tensor
    knobs: K
    audio_embeds: torch.Tensor | None = None
    audio_feature_lengths: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    deepstack_image_embeds: tuple[torch.Tensor, ...] | None = None
    image_grid_thw: torch.Tensor | None = None


__all__ = [
    "AudioEmbeddings",
    "AudioEncoderInput",
    "ImageEmbeddings",
    "ImageEncoderInput",
    "Preprocessed",
    "PreprocessedText",
    "ThinkerInput",
]
