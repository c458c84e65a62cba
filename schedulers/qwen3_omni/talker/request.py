"""One request's life at the talker stage: what it has heard from the thinker and where its speech is.

A request moves through :class:`Phase` in order (it may skip to ``SPOKEN``):

* ``WAITING_PROMPT``: nothing but (maybe) its payload has come; the thinker's ``prompt`` chunk is next;
* ``PREFILL``: it has its prompt, and prefills once its first answer token is known to be forwarded;
* ``DECODING``: it steps; each step needs its next text (:meth:`TextFeed.trailing`) and sits out
  until the thinker streamed it;
* ``SPOKEN``: its codes are done (``codec_eos``, ``max_new_tokens``, or no audio wanted); it ends once
  the thinker's stream and payload are both in.

:func:`parse_prompt` validates the ``prompt`` chunk, whose fields :mod:`schedulers.qwen3_omni.thinker.stage`
documents (it is what the thinker stage sends the talker).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs
import torch

from omnitrio.contract import InvalidRequest, StagePayload
from schedulers._idsets import Life
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling
from schedulers.qwen3_omni.talker.prompt import TextFeed

KNOBS = frozenset(attrs.fields_dict(TalkerSampling))


class Phase(enum.Enum):
    WAITING_PROMPT = "waiting-prompt"
    PREFILL = "prefill"
    DECODING = "decoding"
    SPOKEN = "spoken"


@attrs.define(eq=False)
class Prompt:
    """The thinker's ``prompt`` chunk, validated."""

    token_ids: torch.Tensor
    embeds: torch.Tensor
    hidden: torch.Tensor
    speaker: str | None
    knobs: dict[str, Any]
    want_audio: bool
    image_grid_thw: torch.Tensor | None
    audio_feature_lengths: torch.Tensor | None


def _tensor(data: dict[str, Any], key: str, dims: int, dtype: torch.dtype, *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    tensor = torch.as_tensor(value) if value is not None else None
    if tensor is None or tensor.dim() != dims:
        raise ValueError(f"talker: prompt chunk field {key!r} must be a {dims}-d tensor, got {value!r:.80}")
    return tensor.to(dtype)


def parse_prompt(data: Any) -> Prompt:
    """The ``prompt`` chunk's fields; ValueError naming the field that is missing or malformed."""
    if not isinstance(data, dict) or data.get("kind") != "prompt":
        raise ValueError(f"talker: the thinker stream must start with a 'prompt' chunk, got {data!r:.80}")
    token_ids = _tensor(data, "token_ids", 1, torch.long)
    embeds = _tensor(data, "embeds", 2, torch.float32)
    hidden = _tensor(data, "hidden", 2, torch.float32)
    if not embeds.shape[0] == hidden.shape[0] == token_ids.shape[0]:
        raise ValueError(
            f"talker: prompt chunk has {token_ids.shape[0]} token_ids, {embeds.shape[0]} embeds rows and "
            f"{hidden.shape[0]} hidden rows; they must match"
        )
    knobs = data.get("talker") or {}
    if not isinstance(knobs, dict) or not set(knobs) <= KNOBS:
        raise InvalidRequest(
            f"talker options must be a dict with keys in {sorted(KNOBS)}, got {knobs!r}", param="talker"
        )
    return Prompt(
        token_ids=token_ids,
        embeds=embeds,
        hidden=hidden,
        speaker=data.get("speaker"),
        knobs=dict(knobs),
        want_audio=bool(data.get("want_audio", True)),
        image_grid_thw=_tensor(data, "image_grid_thw", 2, torch.long, optional=True),
        audio_feature_lengths=_tensor(data, "audio_feature_lengths", 1, torch.long, optional=True),
    )


@attrs.define(eq=False)
class TalkerRequest:
    """Everything the talker holds for one request (its KV cache lives in the stage's BatchedKV)."""

    life: Life
    phase: Phase = Phase.WAITING_PROMPT
    prompt: Prompt | None = None
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
