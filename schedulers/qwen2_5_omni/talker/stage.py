"""The Qwen2.5-Omni talker stage: the thinker's stream in, codec codes out, many requests per step.

Input, per request (the classes of :mod:`schedulers.qwen2_5_omni.handoffs`): the thinker's stream — a
``TalkerPrompt``, then one ``TalkerToken`` per forwarded answer token — then its ``ThinkerResult`` as the
payload (it also ends the text).  Output: ``TalkerCodes`` stream chunks (``frames_per_chunk`` codes each,
the last one shorter; every chunk carries the request's ``Voice``; ``metadata={"modality": "codes"}``),
then one result whose payload's data is ``TalkerDone(num_codes, voice)``; or one ``error``.

What a caller may rely on:

* **Equal to transformers**: the prompt, each step's input and every code are what
  ``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` builds and chooses (see
  :mod:`.prompt`, :mod:`.codec_sampling`); with ``do_sample=False`` its codes exactly.  The speech ends
  where ``generate``'s talker ends: a codec pad or end code (not sent), or ``max_new_tokens`` codes.
  Sampled codes draw from a per-request CPU generator seeded with the voice's ``seed``.
* **Streaming, continuous batching, abort**: the kit's stream-fed lifecycle
  (:mod:`schedulers.engine.stream_fed`): a request prefills once the thinker forwarded its first answer
  token, then steps while the thinker still decodes, up to ``max_batch_size`` requests per forward, each
  in its row of one KV batch at positions equal to its cached length (sequential on all rope axes).
* A ``TalkerPrompt`` whose voice names no speaker of the checkpoint (any case) is an ``InvalidRequest``
  (``param="audio.voice"``) naming the speakers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from omnitrio.contract import InvalidRequest
from schedulers._idsets import Life
from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.engine.handoffs import ThinkerResult
from schedulers.engine.stream_fed import Phase, StreamEdges, StreamFedRequest, StreamFedTalker
from schedulers.qwen2_5_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen2_5_omni.handoffs import TalkerCodes, TalkerDone, TalkerPrompt, TalkerToken, Voice
from schedulers.qwen2_5_omni.talker.codec_sampling import CodecSampler, CodecSampling
from schedulers.qwen2_5_omni.talker.model import TalkerModel
from schedulers.qwen2_5_omni.talker.prompt import TalkerText
from schedulers.warm_up import WarmUp


@attrs.define(eq=False)
class SpeechRequest(StreamFedRequest):
    """One request's thinker text, code choice and voice (its KV row lives in the stage's KV batch)."""

    text: TalkerText | None = None
    sampler: CodecSampler | None = None
    voice: Voice | None = None
    code: int | None = None
    """The last code chosen: its embedding is part of the next step's input."""

    def text_state(self) -> TalkerText | None:
        return self.text

    def decode_ready(self) -> bool:
        return self.code is not None and self.text is not None and self.text.has_step(self.step + 1)

    def decode_input(self) -> torch.Tensor | None:
        if self.phase is not Phase.DECODING or not self.decode_ready():
            return None
        assert self.text is not None and self.code is not None
        return self.text.step_input(self.step + 1, self.code)

    def release(self) -> None:
        self.text = None
        self.code = None


class TalkerScheduler(StreamFedTalker[SpeechRequest]):
    """Qwen2.5-Omni's talker over the kit's stream-fed lifecycle: ``sampling`` is every request's code choice
    (seeded by its voice), ``warm_up`` what :meth:`warm_up_serving_thread` runs (module docstring)."""

    edges = StreamEdges(TalkerPrompt, TalkerToken, ThinkerResult)

    def __init__(
        self,
        model: TalkerModel,
        *,
        sampling: CodecSampling | None = None,
        warm_up: WarmUp | None = None,
        frames_per_chunk: int = 1,
        max_batch_size: int = 16,
    ) -> None:
        super().__init__(
            layers=model.num_layers,
            device=model.device,
            frames_per_chunk=frames_per_chunk,
            max_batch_size=max_batch_size,
        )
        self.model = model
        self.sampling = sampling or CodecSampling()
        self._speakers = {name.lower(): name for name in model.speaker_rows}
        self._warm_up = warm_up or WarmUp()

    @property
    def warmed(self) -> list[str]:
        return self._warm_up.warmed

    def warm_up_serving_thread(self) -> None:
        super().warm_up_serving_thread()
        self._warm_up.run()

    # -- the kit's hooks (scheduler thread) ------------------------------------------------

    def _new_request(self, life: Life) -> SpeechRequest:
        return SpeechRequest(life)

    def _on_prompt(self, req: SpeechRequest, data: TalkerPrompt) -> None:
        speaker = self._speakers.get(str(data.voice.speaker).lower())
        if speaker is None:
            raise InvalidRequest(
                f"voice {data.voice.speaker!r} is not one of this model's speakers {sorted(self.model.speaker_rows)}",
                param="audio.voice",
            )
        req.voice = data.voice
        req.text = TalkerText(self.model, data.token_ids, data.hidden, data.embeds, speaker)
        req.sampler = CodecSampler(self.model, self.sampling, seed=data.voice.seed)

    def _on_token(self, req: SpeechRequest, data: TalkerToken) -> None:
        if req.text is not None:
            req.text.add(data.hidden, data.embed)

    def _prefill(self, req: SpeechRequest) -> torch.Tensor:
        assert req.text is not None
        rows = req.text.prefill()
        self.kv.add(req.request_id)
        step = self.kv.step([req.request_id], tokens=rows.shape[0])
        positions = torch.arange(rows.shape[0]).view(1, 1, -1).expand(3, 1, -1)
        return self.model.forward(rows[None], positions, step.cache, step.attention_mask())[0]

    def _decode(self, decoding: Sequence[tuple[SpeechRequest, torch.Tensor]]) -> list[torch.Tensor]:
        step = self.kv.step([req.request_id for req, _ in decoding])
        inputs = torch.stack([x for _, x in decoding]).unsqueeze(1)
        positions = torch.tensor(step.lengths).view(1, -1, 1).expand(3, -1, -1)
        return list(self.model.forward(inputs, positions, step.cache, step.padding_mask()))

    def _choose(self, stepped: Sequence[tuple[SpeechRequest, torch.Tensor]]) -> None:
        for req, logits in stepped:
            sampler = req.sampler
            assert sampler is not None
            try:
                code = sampler.choose(logits)
            except Exception as exc:
                self._fail(req, exc)
                continue
            if code not in sampler.ends:
                req.code = code
                self._add_frame(req, code)
            if sampler.done:
                self._spoken(req)

    def _chunk(self, req: SpeechRequest, frames: list[Any]) -> TalkerCodes:
        return TalkerCodes(torch.tensor(frames, dtype=torch.long), voice=req.voice)

    def _result(self, req: SpeechRequest) -> TalkerDone:
        return TalkerDone(req.num_frames, req.voice)


def warm_up_talker(model: TalkerModel) -> None:
    """One prefill and one decode step of a short made-up prompt: the first request pays no first-run cost."""
    width = model.text_pad.shape[0]
    prompt = torch.zeros(4, width)
    text = TalkerText(model, torch.zeros(4, dtype=torch.long), prompt, prompt, next(iter(model.speaker_rows)))
    text.add(model.text_pad, model.text_pad)
    text.end()
    scheduler = TalkerScheduler(model, max_batch_size=1)
    rows = text.prefill()
    scheduler.kv.add("warm-up")
    step = scheduler.kv.step(["warm-up"], tokens=rows.shape[0])
    model.forward(rows[None], torch.arange(rows.shape[0]).view(1, 1, -1).expand(3, 1, -1), step.cache)
    step = scheduler.kv.step(["warm-up"])
    model.forward(text.step_input(1, model.codec_pad)[None, None], torch.full((3, 1, 1), rows.shape[0]), step.cache)


@checked_by(preflight)
def create_talker_stage(
    *,
    model_dir: str | None = None,
    frames_per_chunk: int = 1,
    max_batch_size: int = 16,
    warm_up: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    **sampling: Any,
) -> TalkerScheduler:
    """The talker stage for the checkpoint in ``model_dir`` (loads ``talker.`` weights and the thinker
    embedding rows it needs).

    ``sampling``: :class:`~.codec_sampling.CodecSampling`'s knobs (``generate``'s ``talker_*`` arguments,
    its defaults when not given); ``do_sample=False`` is greedy.  ``device``/``dtype`` place the talker
    (:mod:`schedulers.devices`); chunks arrive on the CPU, codes go out on the CPU.  ``warm_up``: one short
    prefill and decode before the stage reports ready."""
    placement = Placement.of("talker", device, dtype)
    try:
        knobs = CodecSampling(**sampling)
    except TypeError as exc:
        raise ValueError(f"talker: {exc}; the sampling knobs are {sorted(attrs.fields_dict(CodecSampling))}") from exc
    model = TalkerModel.from_checkpoint(
        Path(require_model_dir(model_dir)), dtype=placement.dtype, device=str(placement.device)
    )
    steps = WarmUp().step("talker forward", lambda: warm_up_talker(model)) if warm_up else None
    return TalkerScheduler(
        model, sampling=knobs, frames_per_chunk=frames_per_chunk, max_batch_size=max_batch_size, warm_up=steps
    )
