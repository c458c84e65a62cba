"""The talker's prompt and per-step text, built from the thinker's stream as ``generate`` builds them.

transformers' ``Qwen3OmniMoeForConditionalGeneration.generate`` gives the talker:

* the **user part**: every prompt position whose turn is a user turn (system and earlier assistant
  turns are skipped), ``hidden_projection(thinker hidden)`` at audio/image/video positions and
  ``text_projection(thinker embedding)`` elsewhere;
* the **assistant part** (9 positions): the projected ``<|im_start|>assistant\\n``, four ``tts_pad``,
  ``tts_bos`` and the first answer token, plus the codec embeddings of ``[nothink, think_bos,
  think_eos, speaker, codec_pad, codec_bos]`` on the last six;
* then, at decode step ``s`` (0-based), the projected answer token ``s + 1``, then ``tts_eos`` once,
  then ``tts_pad`` for ever.

The thinker only ever *forwards* the prompt and its answer tokens except the last (the last one, eos
or the length cut, is never fed back), and those are the rows ``generate`` uses.  A stream does not say
which token is the last until it ends, so :class:`TextFeed` uses token ``i`` once token ``i + 1`` has
arrived or the stream has ended; until then a step that needs it waits (:meth:`TextFeed.trailing`
returns None).  All methods run on the scheduler thread.
"""

from __future__ import annotations

import attrs
import torch

from schedulers.qwen3_omni.talker.model import TalkerModel

ASSISTANT_PREFIX = 3
"""Projected rows of the assistant turn before the first answer token (``<|im_start|>assistant\\n``)."""


def user_part(
    model: TalkerModel, token_ids: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The user part ``([U, H], [U])``: talker inputs and the thinker ids they stand for, in prompt order."""
    ids = model.ids
    length = token_ids.shape[0]
    positions = torch.arange(length, device=token_ids.device)
    im_starts = torch.where(token_ids == ids.im_start, positions, positions.new_full((), -1))
    previous_start = torch.cummax(im_starts, dim=0).values.clamp_min(0)
    roles = token_ids.gather(0, (previous_start + 1).clamp_max(length - 1))
    user_mask = roles == ids.user
    mm_mask = torch.isin(token_ids, torch.tensor(ids.multimodal, device=token_ids.device))
    full = torch.empty(length, model.tts_pad.shape[0], dtype=model.dtype, device=model.device)
    if bool(mm_mask.any()):
        full[mm_mask] = model.project_hidden(hidden[mm_mask])
    full[~mm_mask] = model.project_text(embeds[~mm_mask])
    return full[user_mask], token_ids[user_mask]


def assistant_start(model: TalkerModel, token_ids: torch.Tensor) -> int:
    """Index of the last ``<|im_start|>assistant`` of the prompt; ValueError when there is none."""
    ids = model.ids
    starts = ((token_ids[:-1] == ids.im_start) & (token_ids[1:] == ids.assistant)).nonzero().flatten()
    if starts.numel() == 0:
        raise ValueError("talker: the thinker prompt has no '<|im_start|>assistant' turn to speak")
    return int(starts[-1])


@attrs.define(eq=False)
class TextFeed:
    """One request's thinker stream as the talker consumes it (see the module docstring).

    Assistant rows are the prompt's assistant prefix, then each answer token once it is known to have
    been forwarded; ``unprojected`` rows are projected together the first time a step needs one.
    """

    model: TalkerModel
    user_embeds: torch.Tensor
    user_ids: torch.Tensor
    projected: torch.Tensor
    unprojected: list[torch.Tensor]
    newest: torch.Tensor | None = None
    """The latest answer token's embedding: not yet known to have been forwarded."""
    ended: bool = False

    @classmethod
    def start(cls, model: TalkerModel, token_ids: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor) -> TextFeed:
        device = model.device
        token_ids, embeds, hidden = token_ids.to(device), embeds.to(device), hidden.to(device)
        user_embeds, user_ids = user_part(model, token_ids, embeds, hidden)
        start = assistant_start(model, token_ids)
        empty = torch.empty(0, model.tts_pad.shape[0], dtype=model.dtype, device=model.device)
        return cls(model, user_embeds, user_ids, empty, [embeds[start:]])

    def add_token(self, embed: torch.Tensor) -> None:
        """An answer token's thinker embedding ``[1, H_thinker]`` arrived: the one before it was forwarded."""
        if self.newest is not None:
            self.unprojected.append(self.newest)
        self.newest = embed.reshape(1, -1).to(self.model.device)

    def end(self) -> None:
        """The thinker finished: its last token is never forwarded."""
        self.ended = True
        self.newest = None

    @property
    def known_rows(self) -> int:
        return int(self.projected.shape[0]) + sum(int(block.shape[0]) for block in self.unprojected)

    def _rows(self) -> torch.Tensor:
        if self.unprojected:
            fresh = self.model.project_text(torch.cat(self.unprojected))
            self.projected = torch.cat((self.projected, fresh))
            self.unprojected = []
        return self.projected

    def prefill_ready(self) -> bool:
        """The prefill's rows are known: the first answer token was forwarded, or the stream ended."""
        return self.ended or self.known_rows > ASSISTANT_PREFIX

    def speakable(self) -> bool:
        """False when the thinker ended without forwarding an answer token (``generate`` cannot speak it)."""
        return self.known_rows > ASSISTANT_PREFIX

    def prefill(self, speaker_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefill ``(inputs [S, H], talker ids [S])``: user part then the 9-position assistant part."""
        model, ids = self.model, self.model.ids
        rows = self._rows()
        text = torch.cat(
            (
                rows[:ASSISTANT_PREFIX],
                model.tts_pad.expand(4, -1),
                model.tts_bos.view(1, -1),
                rows[ASSISTANT_PREFIX : ASSISTANT_PREFIX + 1],
            )
        )
        specials = torch.tensor(
            [ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos, speaker_id, ids.codec_pad, ids.codec_bos],
            device=model.device,
        )
        zeros = torch.zeros(ASSISTANT_PREFIX, text.shape[1], dtype=text.dtype, device=text.device)
        codec = torch.cat((zeros, model.codec_embed(specials)))
        assistant = text + codec
        pads = torch.full((assistant.shape[0],), ids.tts_pad, device=self.user_ids.device)
        talker_ids = torch.cat((self.user_ids, pads))
        return torch.cat((self.user_embeds, assistant)), talker_ids

    def has_trailing(self, step: int) -> bool:
        """Whether :meth:`trailing` knows decode step ``step``'s text."""
        return self.ended or ASSISTANT_PREFIX + 1 + step < self.known_rows

    def trailing(self, step: int) -> torch.Tensor | None:
        """The text added to decode step ``step``'s input ``[H]``, or None while it is not known yet."""
        row = ASSISTANT_PREFIX + 1 + step
        if row < self.known_rows:
            return self._rows()[row]
        if not self.ended:
            return None
        last = max(self.known_rows - (ASSISTANT_PREFIX + 1), 0)
        return self.model.tts_eos if step == last else self.model.tts_pad
