"""What Qwen3-Omni's stages hand each other: one class per edge of the graph, built by its producer, read by
its consumer (:mod:`.graph` says which edge goes where).

Shapes: ``P`` prompt tokens, ``H`` the thinker's hidden size, ``Q`` the codec's quantizers.  Every tensor
here is on the CPU (the producer moves it there), so any process can read it.

Every class is a :func:`schedulers.handoff.handoff` (that module states who owns its tensors and how it
pickles).  The edges every family shares live where they are built: the front's preprocessed prompt,
encoder inputs and audio embeddings in :mod:`schedulers.front.handoffs`, the decoder's tokens and result
in :mod:`schedulers.engine.handoffs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from schedulers.handoff import handoff

if TYPE_CHECKING:  # the annotations only: the graph's routing imports these classes without torch
    import torch


@handoff
@attrs.frozen
class Knobs:
    """What the client asked of the answer, read from the chat request by ``preprocess`` and carried to
    the thinker (``max_new_tokens``, ``temperature``: None means the stage's default) and the talker
    (``speaker``: a checkpoint speaker name, None for the default; ``talker``: the request's talker
    sampling options, validated by the talker; ``want_audio``: whether the answer is spoken)."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    speaker: str | None = None
    talker: dict[str, Any] | None = None
    want_audio: bool = False


@handoff
@attrs.frozen(eq=False)
class TalkerPrompt:
    """``thinker`` → ``talker``, the first chunk of its stream (only when the answer is spoken): the
    prompt as the thinker saw it, for the talker to build its own prompt from.

    ``token_ids`` ``Long[P]``; ``embeds`` ``Float[P, H]`` (``hidden_states[0]`` of the prompt) and
    ``hidden`` ``Float[P, H]`` (the state at ``talker_config.accept_hidden_layer``), float32, as
    ``generate`` computes them; the request's ``speaker`` and ``talker`` options (:class:`Knobs`);
    ``image_grid_thw`` / ``audio_feature_lengths`` for the talker's rope positions (None without media)."""

    token_ids: torch.Tensor
    embeds: torch.Tensor
    hidden: torch.Tensor
    speaker: str | None = None
    talker: dict[str, Any] | None = None
    image_grid_thw: torch.Tensor | None = None
    audio_feature_lengths: torch.Tensor | None = None


@handoff
@attrs.frozen(eq=False)
class TalkerToken:
    """``thinker`` → ``talker``, after :class:`TalkerPrompt`, one per generated token as soon as it is
    chosen: its id and its input embedding ``embed`` ``Float[1, H]`` (float32)."""

    token_id: int
    embed: torch.Tensor


@handoff
@attrs.frozen(eq=False)
class Codes:
    """``talker`` → ``code2wav``, in order: whole frames ``codes`` ``Long[Q, n]`` (``n >= 1``), the
    ``codec_eos`` frame never among them."""

    codes: torch.Tensor


@handoff
@attrs.frozen
class TalkerResult:
    """The talker's result → ``code2wav``: ``num_frames``, how many frames its :class:`Codes` chunks held
    (0 when the answer is not spoken, or the thinker gave nothing to speak)."""

    num_frames: int


__all__ = [
    "Codes",
    "Knobs",
    "TalkerPrompt",
    "TalkerResult",
    "TalkerToken",
]
