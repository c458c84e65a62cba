"""The decoder's handoffs that are the same for every Qwen omni family: what a thinker hands its text
decode (and, when the answer is spoken, its talker) per token and at the end.  A family's ``handoffs``
module re-exports them beside its own; the same promises hold (a handoff is built once and never changed)
and each pickles as a constructor call (:func:`schedulers.handoff.handoff`).
"""

from __future__ import annotations

import attrs

from schedulers.engine.admission import FinishReason
from schedulers.handoff import handoff


@handoff
@attrs.frozen
class DecodeToken:
    """``thinker`` → ``decode``, one per generated token as soon as it is chosen, in order (the last may be
    the eos): its id, and whether the answer is spoken (then its words are the audio's transcript)."""

    token_id: int
    want_audio: bool


@handoff
@attrs.frozen
class ThinkerResult:
    """The thinker's result → ``decode`` and (when the answer is spoken) ``talker``; it ends their text.

    ``token_ids``: the generated ids, eos included; ``prompt_len``: the prompt's tokens;
    ``finish_reason``: ``"stop"`` (eos) or ``"length"``; ``want_audio`` as the client asked."""

    token_ids: tuple[int, ...]
    prompt_len: int
    finish_reason: FinishReason
    want_audio: bool = False

    @property
    def usage(self) -> dict[str, int]:
        """OpenAI's ``usage`` of the answer: ``{"prompt_tokens", "completion_tokens"}``."""
        return {"prompt_tokens": self.prompt_len, "completion_tokens": len(self.token_ids)}


__all__ = ["DecodeToken", "FinishReason", "ThinkerResult"]
