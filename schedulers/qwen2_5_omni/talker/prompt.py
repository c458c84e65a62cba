"""The talker's input, built from the thinker's stream as transformers 5.23's ``generate`` builds it.

``Qwen2_5OmniForConditionalGeneration.generate`` feeds the talker, in the thinker's width:

* the **prompt** (its prefill), ``P + 2`` rows: per thinker prompt position its last hidden state plus its
  input embedding, the embedding (not the hidden state) zeroed at audio, image and video placeholders;
  then the speaker's ``bos_token`` row of the thinker's embedding; then answer token 0's hidden state plus
  embedding;
* at decode step ``s`` (1, 2, ...): the codec embedding of the code chosen at step ``s - 1``, plus answer
  token ``s``'s hidden state and embedding while the thinker forwarded one, then ``<tts_text_eod>``'s
  embedding once, then ``<tts_text_pad>``'s for ever.

The thinker forwards its prompt and every answer token but the last (eos, or the token cut at
``max_tokens``: it has no hidden state), and those are the rows ``generate`` uses.

Positions are sequential, ``0 .. P + 1`` for the prompt and the cache length at each step, on all three
rope axes: ``generate`` drops an all-ones attention mask, so the talker's forward never takes the branch
that would compute 3-D positions and add the codec pad and bos embeddings to the prompt's last two rows;
for one request it does neither, and neither is done here.

:class:`TalkerText` holds one request's stream; a step whose text has not arrived yet waits
(:meth:`TalkerText.has_step` is False).  All sums are done in the order ``generate`` does them (hidden +
embedding first, then the codec embedding), so the inputs equal its bit for bit.
"""

from __future__ import annotations

import torch

from schedulers.qwen2_5_omni.talker.model import TalkerModel


class TalkerText:
    """One request's thinker stream as the talker reads it (module docstring).

    ``prompt_ids [P]``, ``prompt_hidden [P, H]`` and ``prompt_embeds [P, H]`` are the thinker's prompt
    (its ids, last hidden states and input embeddings, audio/image features in place); :meth:`add` takes
    each forwarded answer token in order, :meth:`end` the end of the stream."""

    def __init__(
        self,
        model: TalkerModel,
        prompt_ids: torch.Tensor,
        prompt_hidden: torch.Tensor,
        prompt_embeds: torch.Tensor,
        speaker: str,
    ) -> None:
        if speaker not in model.speaker_rows:
            raise ValueError(f"speaker: {speaker!r} is not one of {', '.join(model.speaker_rows)}")
        device, dtype = model.device, model.dtype
        ids = prompt_ids.reshape(-1).to(device)
        if prompt_hidden.shape != prompt_embeds.shape or prompt_hidden.shape[0] != ids.shape[0]:
            raise ValueError(
                f"talker prompt: ids {list(ids.shape)}, hidden {list(prompt_hidden.shape)} and embeds "
                f"{list(prompt_embeds.shape)} must cover the same positions"
            )
        embeds = prompt_embeds.to(device, dtype).clone()
        embeds[torch.isin(ids, torch.tensor(model.media_ids, device=device))] = 0
        self.model = model
        self.speaker = speaker
        self._prompt = prompt_hidden.to(device, dtype) + embeds
        self._rows: list[torch.Tensor] = []
        self.ended = False

    @property
    def forwarded(self) -> int:
        """Answer tokens received so far."""
        return len(self._rows)

    def add(self, hidden: torch.Tensor, embed: torch.Tensor) -> None:
        """The next forwarded answer token's last hidden state and input embedding (``[H]`` each)."""
        if self.ended:
            raise ValueError("talker: an answer token arrived after the thinker's end of stream")
        model = self.model
        self._rows.append(
            hidden.reshape(-1).to(model.device, model.dtype) + embed.reshape(-1).to(model.device, model.dtype)
        )

    def end(self) -> None:
        """The thinker's stream ended: no more answer tokens."""
        self.ended = True

    def prefill_ready(self) -> bool:
        """The prefill's rows are known: answer token 0 arrived, or the stream ended."""
        return self.ended or bool(self._rows)

    def speakable(self) -> bool:
        """False when the stream ended before any answer token was forwarded: ``generate`` has nothing to
        voice (one-token answers)."""
        return bool(self._rows)

    def prefill(self) -> torch.Tensor:
        """The prompt's rows ``[P + 2, H]`` (module docstring); needs :meth:`speakable`."""
        if not self._rows:
            raise ValueError("talker: no answer token was forwarded, there is nothing to voice")
        speaker = self.model.speaker_rows[self.speaker]
        return torch.cat((self._prompt, speaker[None], self._rows[0][None]))

    def has_step(self, step: int) -> bool:
        """Whether decode step ``step``'s text (``step >= 1``) is known."""
        return self.ended or step < len(self._rows)

    def step_text(self, step: int) -> torch.Tensor:
        """The thinker's part of decode step ``step``'s input, ``[H]``; needs :meth:`has_step`."""
        if step < len(self._rows):
            return self._rows[step]
        if not self.ended:
            raise ValueError(f"talker: step {step}'s text has not arrived ({len(self._rows)} tokens so far)")
        return self.model.text_eod if step == len(self._rows) else self.model.text_pad

    def step_input(self, step: int, previous_code: int) -> torch.Tensor:
        """Decode step ``step``'s whole input ``[H]``: the previous code's embedding plus :meth:`step_text`."""
        code = torch.tensor(previous_code, device=self.model.device)
        return self.model.codec_embed(code) + self.step_text(step)
