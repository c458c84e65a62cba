"""What Qwen2.5-Omni's stages hand each other: one attrs class per edge, its promise in its docstring.

Stream chunks and result payloads carry these objects as they are (same process) or pickled (other
processes); tensors are CPU tensors.
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class Voice:
    """How one request's speech sounds: ``speaker`` (a name of the checkpoint's ``spk_dict.pt``, any case),
    ``seed`` (the DiT's initial noise is ``torch.Generator("cpu").manual_seed(seed)``'s normal stream, as
    ``generate`` draws it after ``torch.manual_seed(seed)``) and ``stream`` (False: decoded whole once the
    codes end, equal to ``generate``'s audio; True: in chunks as the codes come)."""

    speaker: str
    seed: int
    stream: bool = True


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


__all__ = ["TalkerCodes", "TalkerDone", "Voice"]
