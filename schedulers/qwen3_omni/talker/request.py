"""One request's state at the Qwen3-Omni talker stage: the kit's :class:`~schedulers.engine.stream_fed.StreamFedRequest`
with the thinker's text (:class:`~schedulers.qwen3_omni.talker.prompt.TextFeed`) and the code predictor's
last frame.

:func:`check_prompt` checks that a ``TalkerPrompt``'s tensors agree and its talker options are known.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from omnitrio.contract import InvalidRequest
from schedulers.engine.stream_fed import Phase, StreamFedRequest
from schedulers.qwen3_omni.handoffs import TalkerPrompt
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling
from schedulers.qwen3_omni.talker.prompt import TextFeed

KNOBS = frozenset(attrs.fields_dict(TalkerSampling))


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
class TalkerRequest(StreamFedRequest):
    """Everything the talker holds for one request (its KV cache lives in the stage's KVBatch)."""

    prompt: TalkerPrompt | None = None
    feed: TextFeed | None = None
    sampling: TalkerSampling = attrs.field(factory=TalkerSampling)
    speaker_id: int = 0
    positions: torch.Tensor = attrs.field(factory=lambda: torch.zeros(4, dtype=torch.long))
    """Position ids ``[4]`` (text row, then mrope rows) of the next decode input: each row's last + 1."""
    history: list[int] = attrs.field(factory=list)
    """First codes chosen so far (the repetition penalty's window; one per generated talker token)."""
    next_input: torch.Tensor | None = None
    """The last frame's codec embedding sum, waiting for its text."""

    def text_state(self) -> TextFeed | None:
        return self.feed

    def decode_ready(self) -> bool:
        return self.next_input is not None and self.feed is not None and self.feed.has_trailing(self.step)

    def decode_input(self) -> torch.Tensor | None:
        """The next decode step's input ``[H]`` (frame sum + text), or None while its text is unknown."""
        if self.phase is not Phase.DECODING or self.feed is None or self.next_input is None:
            return None
        text = self.feed.trailing(self.step)
        return None if text is None else self.next_input + text

    def release(self) -> None:
        self.feed = None
        self.next_input = None
