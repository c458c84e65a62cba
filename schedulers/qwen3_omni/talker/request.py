"""One request's life at the talker stage: what it has heard from the thinker and where its speech is.

A request moves through :class:`Phase` in order (it may skip to ``SPOKEN``):

* ``WAITING_PROMPT``: nothing but (maybe) its payload has come; the thinker's
  :class:`~schedulers.qwen3_omni.handoffs.TalkerPrompt` is next;
* ``PREFILL``: it has its prompt, and prefills once its first answer token is known to be forwarded;
* ``DECODING``: it steps; each step needs its next text (:meth:`TextFeed.trailing`) and sits out
  until the thinker streamed it;
* ``SPOKEN``: its codes are done (``codec_eos``, ``max_new_tokens``, or no audio wanted); it ends once
  the thinker's stream and payload are both in.

:func:`check_prompt` checks that a ``TalkerPrompt``'s tensors agree and its talker options are known.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs
import torch

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers._idsets import Life
from schedulers.qwen3_omni.handoffs import TalkerPrompt
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling
from schedulers.qwen3_omni.talker.prompt import TextFeed

KNOBS = frozenset(attrs.fields_dict(TalkerSampling))


class Phase(enum.Enum):
    WAITING_PROMPT = "waiting-prompt"
    PREFILL = "prefill"
    DECODING = "decoding"
    SPOKEN = "spoken"


def check_prompt(data: Any) -> TalkerPrompt:
    """``data`` as the ``TalkerPrompt`` it must be: ValueError when it is not one or its rows disagree,
    ``InvalidRequest`` (``param="talker"``) for talker options this stage does not know."""
    if not isinstance(data, TalkerPrompt):
        raise ValueError(f"talker: the thinker stream must start with a TalkerPrompt, got {type(data).__name__}")
    rows = (data.token_ids.shape[0], data.embeds.shape[0], data.hidden.shape[0])
    if data.token_ids.dim() != 1 or data.embeds.dim() != 2 or data.hidden.dim() != 2 or len(set(rows)) != 1:
        raise ValueError(
            f"talker: TalkerPrompt has token_ids {list(data.token_ids.shape)}, embeds {list(data.embeds.shape)} "
            f"and hidden {list(data.hidden.shape)}; they must be [P], [P, H] and [P, H]"
        )
    options = data.talker or {}
    if not isinstance(options, dict) or not set(options) <= KNOBS:
        raise InvalidRequest(
            f"talker options must be a dict with keys in {sorted(KNOBS)}, got {options!r}", param="talker"
        )
    return data


@attrs.define(eq=False)
class TalkerRequest:
    """Everything the talker holds for one request (its KV cache lives in the stage's BatchedKV)."""

    life: Life
    phase: Phase = Phase.WAITING_PROMPT
    prompt: TalkerPrompt | None = None
    feed: TextFeed | None = None
    sampling: TalkerSampling = attrs.field(factory=TalkerSampling)
    speaker_id: int = 0
    payload: StagePayload | None = None
    stream_ended: bool = False
    step: int = 0
    """Decode steps taken since the prefill (``generate``'s ``generation_step``)."""
    positions: torch.Tensor = attrs.field(factory=lambda: torch.zeros(4, dtype=torch.long))
    """Position ids ``[4]`` (text row, then mrope rows) of the next decode input: each row's last + 1."""
    history: list[int] = attrs.field(factory=list)
    """First codes chosen so far (the repetition penalty's window; one per generated talker token)."""
    next_input: torch.Tensor | None = None
    """The last frame's codec embedding sum, waiting for its text."""
    unsent: list[torch.Tensor] = attrs.field(factory=list)
    num_frames: int = 0

    @property
    def request_id(self) -> str:
        return self.life.request_id

    def end_of_text(self) -> None:
        """The thinker's stream is over (``stream_done`` or its payload)."""
        self.stream_ended = True
        if self.feed is not None:
            self.feed.end()

    def prefill_ready(self) -> bool:
        return self.phase is Phase.PREFILL and self.feed is not None and self.feed.prefill_ready()

    def decode_ready(self) -> bool:
        return (
            self.phase is Phase.DECODING
            and self.next_input is not None
            and self.feed is not None
            and self.feed.has_trailing(self.step)
        )

    def decode_input(self) -> torch.Tensor | None:
        """The next decode step's input ``[H]`` (frame sum + text), or None while its text is unknown."""
        if self.phase is not Phase.DECODING or self.feed is None or self.next_input is None:
            return None
        text = self.feed.trailing(self.step)
        return None if text is None else self.next_input + text

    def finished(self) -> bool:
        """Its codes are done and the thinker's stream and payload are both in: the result may go."""
        return self.phase is Phase.SPOKEN and self.stream_ended and self.payload is not None
