"""What Qwen2.5-Omni's stages hand each other: one attrs class per edge, its promise in its docstring, built
by its producer, read by its consumer (:mod:`.graph` says which edge goes where).

Shapes: ``P`` prompt tokens, ``H`` the thinker's hidden size.  Every tensor here is on the CPU (the
producer moves it there), so any process can read it.

Ownership and pickling are :mod:`schedulers.handoff`'s promises for every class here (:class:`Voice`,
:class:`TalkerCodes` and :class:`TalkerDone` pickle as plain attrs classes).  The edges every family shares
live where they are built: the front's preprocessed prompt, encoder inputs and audio embeddings in
:mod:`schedulers.front.handoffs`, the decoder's tokens and result in :mod:`schedulers.engine.handoffs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from schedulers.handoff import handoff

if TYPE_CHECKING:  # the annotations only: the graph's routing imports these classes without torch
    import torch


@handoff
@attrs.frozen
class Knobs:
    """What the client asked of the answer, read from the chat request by ``preprocess`` and carried to the
    thinker and, through it, the talker and token2wav.

    ``max_new_tokens``, ``temperature``: the thinker's (None: the stage's default; ``temperature`` 0 is
    greedy); ``seed``: the request's seed (None: none given); ``speaker``: a speaker of the checkpoint's
    ``spk_dict.pt`` exactly as the file spells it (None when the answer is not spoken); ``stream``: the
    answer's audio may be decoded in chunks as the codes come (False: decoded whole, equal to
    ``generate``'s audio); ``want_audio``: the answer is spoken."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    speaker: str | None = None
    stream: bool = True
    want_audio: bool = False


@attrs.frozen
class Voice:
    """How one request's speech sounds: ``speaker`` (a name of the checkpoint's ``spk_dict.pt``, any case),
    ``seed`` (the DiT's initial noise is ``torch.Generator("cpu").manual_seed(seed)``'s normal stream, as
    ``generate`` draws it after ``torch.manual_seed(seed)``) and ``stream`` (False: decoded whole once the
    codes end, equal to ``generate``'s audio; True: in chunks as the codes come)."""

    speaker: str
    seed: int
    stream: bool = True


@handoff
@attrs.frozen(eq=False)
class TalkerPrompt:
    """``thinker`` → ``talker``, the first chunk of its stream (only when the answer is spoken): the prompt
    as the thinker saw it, what :class:`schedulers.qwen2_5_omni.talker.prompt.TalkerText` is built from.

    ``token_ids`` ``Long[P]``; ``hidden`` ``Float[P, H]`` (the thinker's last hidden state per position) and
    ``embeds`` ``Float[P, H]`` (its input embeddings, audio and image features in place), in the thinker's
    dtype, as ``generate`` computes them; ``voice``: the request's speaker, seed and whether token2wav
    streams."""

    token_ids: torch.Tensor
    hidden: torch.Tensor
    embeds: torch.Tensor
    voice: Voice


@handoff
@attrs.frozen(eq=False)
class TalkerToken:
    """``thinker`` → ``talker``, after :class:`TalkerPrompt`, one per answer token the thinker forwarded
    (every generated token but the last, in order, as soon as its forward ran): the token's last hidden state
    ``hidden`` ``Float[H]`` and its input embedding ``embed`` ``Float[H]``."""

    hidden: torch.Tensor
    embed: torch.Tensor


@attrs.frozen(eq=False)
class TalkerCodes:
    """talker → token2wav, a stream chunk: the next codes of the answer's speech, ``Long[n]`` (n >= 1), in the
    order the talker generated them, without its end or pad id.  The request's first chunk carries its
    ``voice``; later chunks may repeat it or leave it None.  The talker's result payload, after its last
    chunk, is a :class:`TalkerDone`."""

    codes: torch.Tensor
    voice: Voice | None = None


@attrs.frozen
class TalkerDone:
    """talker → token2wav, the result payload: ``num_codes`` codes were streamed in all (0: no speech), and
    ``voice`` for a request whose stream carried no chunk."""

    num_codes: int
    voice: Voice | None = None


__all__ = [
    "Knobs",
    "TalkerCodes",
    "TalkerDone",
    "TalkerPrompt",
    "TalkerToken",
    "Voice",
]
