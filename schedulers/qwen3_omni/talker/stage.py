"""The Qwen3-Omni talker stage: the thinker's stream in, codec frames out, many requests per step.

Input, per request (``IncomingMessage``; the classes of :mod:`schedulers.qwen3_omni.handoffs`): the
thinker's ``stream_chunk`` s — first a ``TalkerPrompt``, then one ``TalkerToken`` per answer token —
then ``stream_done`` and the thinker's ``ThinkerResult`` as ``new_request`` (its payload also ends the
text).  Chunks may come before the payload, as the runtime delivers them.

Output, per request, in order: ``stream`` messages holding ``Codes`` (``metadata={"modality":
"codes"}``, ``frames_per_chunk`` frames each, the last one shorter; the ``codec_eos`` frame is not
sent), then one ``result`` whose payload's data is a ``TalkerResult``; or one ``error``.  A request
that does not want audio (a ``ThinkerResult`` with ``want_audio`` false and no stream), or whose
thinker forwarded no answer token, gives 0 frames.

What a caller may rely on:

* **Equal to transformers**: the prompt, each step's input and every code are what
  ``Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`` builds and chooses (see
  :mod:`.prompt`, :mod:`.codec_sampling`, :mod:`.code_predictor`); greedy
  (``do_sample=False``, which makes the code predictor greedy too) gives its codes exactly.
* **Streaming, continuous batching, abort**: the kit's stream-fed lifecycle
  (:mod:`schedulers.engine.stream_fed`): a request prefills as soon as the thinker forwarded its first
  answer token and steps while the thinker is still decoding, up to ``max_batch_size`` decoding requests
  in one talker forward, then the code predictor for all of them in one batched call; each request's
  KV row is freed the moment its codes are done, it fails, or it is aborted.
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
from schedulers.engine.stream_fed import StreamEdges, StreamFedTalker
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen3_omni.handoffs import Codes, TalkerPrompt, TalkerResult, TalkerToken
from schedulers.qwen3_omni.talker.code_predictor import CodePredictor
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling, first_codes, processed_scores, suppressed_mask
from schedulers.qwen3_omni.talker.model import TalkerModel
from schedulers.qwen3_omni.talker.prompt import TextFeed
from schedulers.qwen3_omni.talker.request import TalkerRequest, check_prompt
from schedulers.qwen3_omni.talker.warm_up import talker_warm_up
from schedulers.warm_up import with_warm_up


class TalkerScheduler(StreamFedTalker[TalkerRequest]):
    """The talker stage's scheduler; the formats and promises are in the module docstring."""

    edges = StreamEdges(TalkerPrompt, TalkerToken, ThinkerResult)

    def __init__(
        self,
        model: TalkerModel,
        *,
        sampling: TalkerSampling | None = None,
        frames_per_chunk: int = 1,
        max_batch_size: int = 16,
        default_speaker: str | None = None,
        seed: int = 0,
    ) -> None:
        layers = model.talker.config.text_config.num_hidden_layers
        super().__init__(
            layers=layers, device=model.device, frames_per_chunk=frames_per_chunk, max_batch_size=max_batch_size
        )
        self.model = model
        self.predictor = CodePredictor(model, rows=max_batch_size)
        self.sampling = sampling or TalkerSampling()
        speakers = model.ids.speakers
        if not speakers:
            raise ValueError("talker: the checkpoint's talker_config.speaker_id lists no speaker")
        self.default_speaker = (default_speaker or ("ethan" if "ethan" in speakers else next(iter(speakers)))).lower()
        if self.default_speaker not in speakers:
            raise ValueError(f"talker: default_speaker {default_speaker!r} is not one of {sorted(speakers)}")
        self._suppressed = suppressed_mask(model.vocab_size, model.ids.codec_eos).to(model.device)
        self._generator = torch.Generator(model.device).manual_seed(seed)

    # -- the kit's hooks (scheduler thread) ------------------------------------------------

    def _new_request(self, life: Life) -> TalkerRequest:
        return TalkerRequest(life, sampling=self.sampling)

    def _on_prompt(self, req: TalkerRequest, data: Any) -> None:
        prompt = check_prompt(data)
        speakers = self.model.ids.speakers
        speaker = str(prompt.speaker or self.default_speaker).lower()
        if speaker not in speakers:
            raise InvalidRequest(
                f"voice {prompt.speaker!r} is not one of this model's speakers {sorted(speakers)}", param="audio.voice"
            )
        try:
            req.sampling = TalkerSampling(**{**attrs.asdict(self.sampling), **(prompt.talker or {})})
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"talker options: {exc}", param="talker") from exc
        req.speaker_id = speakers[speaker]
        req.prompt = prompt
        req.feed = TextFeed.start(self.model, prompt.token_ids, prompt.embeds, prompt.hidden)

    def _on_token(self, req: TalkerRequest, data: Any) -> None:
        if req.feed is not None:
            req.feed.add_token(data.embed)  # TextFeed moves it

    def _prefill(self, req: TalkerRequest) -> tuple[torch.Tensor, torch.Tensor]:
        assert req.feed is not None and req.prompt is not None
        embeds, talker_ids = req.feed.prefill(req.speaker_id)
        positions = self.model.prompt_positions(talker_ids, req.prompt.image_grid_thw, req.prompt.audio_feature_lengths)
        self.kv.add(req.request_id)
        step = self.kv.step([req.request_id], tokens=embeds.shape[0])
        hidden, logits = self.model.forward(embeds.unsqueeze(0), positions, step.cache, step.attention_mask())
        req.positions = positions[:, 0, -1] + 1
        req.prompt = None  # the thinker's prompt tensors are not needed any more
        return hidden[0], logits[0]

    def _decode(
        self, decoding: Sequence[tuple[TalkerRequest, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        step = self.kv.step([req.request_id for req, _ in decoding])
        embeds = torch.stack([x for _, x in decoding]).unsqueeze(1)
        positions = torch.stack([req.positions for req, _ in decoding], dim=1).unsqueeze(-1)
        hidden, logits = self.model.forward(embeds, positions, step.cache, step.padding_mask())
        for req, _ in decoding:
            req.positions = req.positions + 1
        return [(hidden[i], logits[i]) for i in range(len(decoding))]

    def _choose(self, stepped: Sequence[tuple[TalkerRequest, tuple[torch.Tensor, torch.Tensor]]]) -> None:
        reqs = [req for req, _ in stepped]
        try:
            knobs = [req.sampling for req in reqs]
            scores = processed_scores(
                torch.stack([logits for _, (_, logits) in stepped]),
                [req.history for req in reqs],
                knobs,
                self._suppressed,
                self.model.ids.codec_eos,
            )
            codes = first_codes(scores, knobs, self._generator)
        except Exception as exc:
            for req in reqs:
                self._fail(req, exc)
            return
        voiced: list[int] = []
        for index, (req, code) in enumerate(zip(reqs, codes, strict=True)):
            req.history.append(code)
            if code == self.model.ids.codec_eos or len(req.history) >= req.sampling.max_new_tokens:
                self._spoken(req)
            else:
                voiced.append(index)
        if not voiced:
            return
        try:
            frames, sums = self.predictor.frames(
                torch.stack([stepped[i][1][0] for i in voiced]),
                torch.tensor([codes[i] for i in voiced], device=self.model.device),
                [not reqs[i].sampling.do_sample for i in voiced],
                self._generator,
            )
        except Exception as exc:
            for i in voiced:
                self._fail(reqs[i], exc)
            return
        for row, i in enumerate(voiced):
            reqs[i].next_input = sums[row]
            self._add_frame(reqs[i], frames[row])

    def _chunk(self, req: TalkerRequest, frames: list[Any]) -> Codes:
        return Codes(torch.stack(frames, dim=1).to(device="cpu", dtype=torch.long))

    def _result(self, req: TalkerRequest) -> TalkerResult:
        return TalkerResult(req.num_frames)


@checked_by(preflight)
def create_talker_stage(
    *,
    model_dir: str | None = None,
    frames_per_chunk: int = 1,
    max_batch_size: int = 16,
    default_speaker: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    **sampling: Any,
) -> TalkerScheduler:
    """The talker stage for the checkpoint in ``model_dir`` (loads ``talker.`` weights and 3 thinker rows).

    ``sampling``: :class:`~.codec_sampling.TalkerSampling`'s knobs, ``generate``'s ``talker_*`` arguments
    and defaults (another name is a ``ValueError`` listing them); a request's ``talker`` options (the
    thinker's prompt chunk) override them.  ``do_sample=False`` is greedy
    for the talker and the code predictor.  ``device``/``dtype`` place the talker and its code predictor,
    which runs in this stage (:mod:`schedulers.devices`); chunks arrive on the CPU, codes go out on the CPU.
    """
    placement = Placement.of("talker", device, dtype)
    try:
        knobs = TalkerSampling(**sampling)
    except TypeError as exc:
        raise ValueError(f"talker: {exc}; the sampling knobs are {sorted(attrs.fields_dict(TalkerSampling))}") from exc
    model_dir = require_model_dir(model_dir)
    model = TalkerModel.from_checkpoint(Path(model_dir), dtype=placement.dtype, device=str(placement.device))
    scheduler = TalkerScheduler(
        model,
        sampling=knobs,
        frames_per_chunk=frames_per_chunk,
        max_batch_size=max_batch_size,
        default_speaker=default_speaker,
        seed=seed,
    )
    return with_warm_up(scheduler, talker_warm_up)
