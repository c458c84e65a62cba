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
* **Streaming**: a request prefills as soon as the thinker forwarded its first answer token and
  steps while the thinker is still decoding; a step whose text has not come yet sits that request out
  while the others step.
* **Continuous batching**: each loop turn prefills the requests that became ready (one forward each)
  and steps up to ``max_batch_size`` decoding requests in one talker forward, then runs the code
  predictor for all of them in one batched call.  Each request has its row in one KV batch
  (:class:`~schedulers.engine.kv_batch.KVBatch`: a request that sits a step out costs nothing, joining
  prefills straight into its row), freed the moment its codes are done, it fails, or it is aborted.
  The loop is the engine layer's (:class:`~schedulers.engine.step_loop.StepLoop`): a turn's outputs
  reach the outbox together, after its step.
* **Abort** (``abort()`` from any thread, or the in-order ``abort`` message) drops the request's
  outputs and frees its state; late chunks of that life are dropped (:mod:`schedulers._idsets`).
  A failing forward fails the requests in it; the others carry on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

import attrs
import torch

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers._idsets import Admission, Life, RequestLedger
from schedulers.devices import Placement
from schedulers.engine.kv_batch import KVBatch
from schedulers.engine.step_loop import StepLoop
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen3_omni.handoffs import Codes, TalkerResult, TalkerToken, ThinkerResult
from schedulers.qwen3_omni.talker.code_predictor import CodePredictor
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling, first_codes, suppressed_mask
from schedulers.qwen3_omni.talker.model import TalkerModel
from schedulers.qwen3_omni.talker.prompt import TextFeed
from schedulers.qwen3_omni.talker.request import Phase, TalkerRequest, check_prompt

logger = logging.getLogger(__name__)

MODALITY: Final = "codes"


@attrs.frozen
class _Free:
    """Inbox message data: free the state of ``life``, aborted from another thread."""

    life: Life


class TalkerScheduler(StepLoop):
    """The talker stage's scheduler; the formats and promises are in the module docstring."""

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
        if frames_per_chunk < 1 or max_batch_size < 1:
            raise ValueError(
                f"talker: frames_per_chunk and max_batch_size must be >= 1, got {frames_per_chunk}, {max_batch_size}"
            )
        super().__init__()
        self.model = model
        self.predictor = CodePredictor(model, rows=max_batch_size)
        self.sampling = sampling or TalkerSampling()
        self.frames_per_chunk = frames_per_chunk
        self.max_batch_size = max_batch_size
        speakers = model.ids.speakers
        if not speakers:
            raise ValueError("talker: the checkpoint's talker_config.speaker_id lists no speaker")
        self.default_speaker = (default_speaker or ("ethan" if "ethan" in speakers else next(iter(speakers)))).lower()
        if self.default_speaker not in speakers:
            raise ValueError(f"talker: default_speaker {default_speaker!r} is not one of {sorted(speakers)}")
        layers = model.talker.config.text_config.num_hidden_layers
        self.kv: KVBatch[str] = KVBatch(layers, device=model.device, rows=max_batch_size)
        self.batch_sizes: list[int] = []
        self._suppressed = suppressed_mask(model.vocab_size, model.ids.codec_eos).to(model.device)
        self._generator = torch.Generator(model.device).manual_seed(seed)
        self._ledger = RequestLedger(self._new_request_queued, retire_on_abort=True)
        self._requests: dict[str, TalkerRequest] = {}

    @property
    def active_requests(self) -> int:
        """Requests holding state here (the scheduler thread's view)."""
        return len(self._requests)

    def abort(self, request_id: str) -> None:
        """Non-blocking; the request's outputs stop now and its state is freed before the next step."""
        outcome = self._ledger.abort(request_id)
        if isinstance(outcome, Life):
            self._inbox.put(IncomingMessage(request_id, "abort", _Free(outcome)))

    def _new_request_queued(self, request_id: str) -> bool:
        with self._inbox.mutex:
            return any(
                isinstance(msg, IncomingMessage) and msg.type == "new_request" and msg.request_id == request_id
                for msg in self._inbox.queue
            )

    # -- messages (scheduler thread) --------------------------------------------------

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                match self._ledger.admit_payload(rid, message.data):
                    case Life() as life:
                        self._guarded(self._request(life), self._on_payload, message.data)
                    case Admission.DUPLICATE:
                        error = ValueError(f"talker: duplicate request {rid!r}")
                        self.emit([OutgoingMessage(rid, "error", error)])
            case "stream_chunk" | "stream_done":
                streamed = self._ledger.admit_stream(rid, is_done=message.type == "stream_done")
                if streamed is not None:
                    req = self._request(streamed)
                    if message.type == "stream_done":
                        self._guarded(req, self._on_end_of_text)
                    else:
                        self._guarded(req, self._on_chunk, message.data)
            case "abort":
                if isinstance(message.data, _Free):
                    self._free(message.data.life)
                else:
                    boundary = self._ledger.close_in_order(rid)
                    if boundary.life is not None:
                        self._free(boundary.life)

    def _request(self, life: Life) -> TalkerRequest:
        req = self._requests.get(life.request_id)
        if req is None or req.life is not life:
            req = self._requests[life.request_id] = TalkerRequest(life, sampling=self.sampling)
        return req

    def _on_payload(self, req: TalkerRequest, payload: Any) -> None:
        if not isinstance(payload, StagePayload) or not isinstance(payload.data, ThinkerResult):
            raise ValueError(
                f"talker: new_request data must be a StagePayload holding a ThinkerResult, got {payload!r:.80}"
            )
        req.payload = payload
        self._on_end_of_text(req)

    def _on_end_of_text(self, req: TalkerRequest) -> None:
        req.end_of_text()
        if req.phase is Phase.WAITING_PROMPT:
            if req.payload is None:
                return  # the payload says whether audio was wanted
            if req.payload.data.want_audio:
                raise ValueError("talker: the thinker's stream ended without its TalkerPrompt")
            req.phase = Phase.SPOKEN
        if req.phase is Phase.PREFILL and req.feed is not None and not req.feed.can_speak():
            req.phase = Phase.SPOKEN
        self._maybe_finish(req)

    def _on_chunk(self, req: TalkerRequest, item: Any) -> None:
        if not isinstance(item, StreamItem):
            raise ValueError(f"talker: stream chunks must be StreamItems, got {item!r:.80}")
        data = item.data
        if req.phase is Phase.WAITING_PROMPT:
            self._on_prompt(req, data)
        elif not isinstance(data, TalkerToken):
            raise ValueError(f"talker: expected a TalkerToken after the TalkerPrompt, got {type(data).__name__}")
        elif req.feed is not None and req.phase is not Phase.SPOKEN:
            req.feed.add_token(data.embed)  # TextFeed moves it

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
        req.phase = Phase.PREFILL

    # -- stepping (scheduler thread) ----------------------------------------------------

    def _has_work(self) -> bool:
        return any(req.prefill_ready() or req.decode_ready() for req in self._requests.values())

    def _step(self) -> list[OutgoingMessage]:
        """Prefill, decode, choose; the outputs go through :meth:`emit` as they come (an empty list back)."""
        stepped: list[tuple[TalkerRequest, torch.Tensor, torch.Tensor]] = []
        for req in [r for r in self._requests.values() if r.prefill_ready()]:
            try:
                stepped.append((req, *self._prefill(req)))
            except Exception as exc:
                self._fail(req, exc)
        ready = [req for req in self._requests.values() if req.decode_ready()][: self.max_batch_size]
        inputs = {req.request_id: (req, x) for req in ready if (x := req.decode_input()) is not None}
        decoding = [inputs[rid] for rid in self.kv.order(inputs)]  # in row order: neighbours read in place
        if decoding:
            try:
                hidden, logits = self._decode(decoding)
            except Exception as exc:
                for req, _ in decoding:
                    self._fail(req, exc)
            else:
                stepped.extend((req, hidden[i], logits[i]) for i, (req, _) in enumerate(decoding))
        if stepped:
            self.batch_sizes.append(len(stepped))
            self._choose(stepped)
        return []

    def _prefill(self, req: TalkerRequest) -> tuple[torch.Tensor, torch.Tensor]:
        assert req.feed is not None and req.prompt is not None
        embeds, talker_ids = req.feed.prefill(req.speaker_id)
        positions = self.model.prompt_positions(talker_ids, req.prompt.image_grid_thw, req.prompt.audio_feature_lengths)
        self.kv.add(req.request_id)
        step = self.kv.step([req.request_id], tokens=embeds.shape[0])
        hidden, logits = self.model.forward(embeds.unsqueeze(0), positions, step.cache, step.attention_mask())
        req.positions = positions[:, 0, -1] + 1
        req.prompt = None  # the thinker's prompt tensors are not needed any more
        req.phase = Phase.DECODING
        return hidden[0], logits[0]

    def _decode(self, decoding: list[tuple[TalkerRequest, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.kv.step([req.request_id for req, _ in decoding])
        embeds = torch.stack([x for _, x in decoding]).unsqueeze(1)
        positions = torch.stack([req.positions for req, _ in decoding], dim=1).unsqueeze(-1)
        hidden, logits = self.model.forward(embeds, positions, step.cache, step.attention_mask())
        for req, _ in decoding:
            req.step += 1
            req.positions = req.positions + 1
        return hidden, logits

    def _choose(self, stepped: list[tuple[TalkerRequest, torch.Tensor, torch.Tensor]]) -> None:
        reqs = [req for req, _, _ in stepped]
        try:
            codes = first_codes(
                torch.stack([logits for _, _, logits in stepped]),
                [req.history for req in reqs],
                [req.sampling for req in reqs],
                self._suppressed,
                self.model.ids.codec_eos,
                self._generator,
            )
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
                torch.stack([stepped[i][1] for i in voiced]),
                torch.tensor([codes[i] for i in voiced], device=self.model.device),
                [not reqs[i].sampling.do_sample for i in voiced],
                self._generator,
            )
        except Exception as exc:
            for i in voiced:
                self._fail(reqs[i], exc)
            return
        for row, i in enumerate(voiced):
            req = reqs[i]
            req.next_input = sums[row]
            req.unsent.append(frames[row])
            req.num_frames += 1
            if len(req.unsent) >= self.frames_per_chunk:
                self._emit(req, [self._codes_message(req)])

    # -- ending ----------------------------------------------------------------------------

    def _codes_message(self, req: TalkerRequest) -> OutgoingMessage:
        codes = torch.stack(req.unsent, dim=1).to(device="cpu", dtype=torch.long)
        req.unsent = []
        return OutgoingMessage(req.request_id, "stream", Codes(codes), metadata={"modality": MODALITY})

    def _spoken(self, req: TalkerRequest) -> None:
        """Its codes are done: free the KV now, send what is left; the result waits for the payload."""
        self.kv.remove(req.request_id)
        req.phase = Phase.SPOKEN
        req.feed = None
        req.next_input = None
        if req.unsent:
            self._emit(req, [self._codes_message(req)])
        self._maybe_finish(req)

    def _maybe_finish(self, req: TalkerRequest) -> None:
        if not req.finished():
            return
        assert req.payload is not None
        messages = [self._codes_message(req)] if req.unsent else []
        req.payload.data = TalkerResult(req.num_frames)
        messages.append(OutgoingMessage(req.request_id, "result", req.payload))
        self._drop_state(req.life)
        if self._ledger.end(req.life):
            self.emit(messages)

    def _emit(self, req: TalkerRequest, messages: list[OutgoingMessage]) -> None:
        if not self._ledger.is_aborted(req.life):
            self.emit(messages)

    def _guarded(self, req: TalkerRequest, handler: Any, *args: Any) -> None:
        try:
            handler(req, *args)
        except Exception as exc:
            self._fail(req, exc)

    def _fail(self, req: TalkerRequest, exc: Exception) -> None:
        logger.debug("talker: request %r failed", req.request_id, exc_info=exc)
        self._drop_state(req.life)
        if self._ledger.end(req.life, failed_stream=True):
            self.emit([OutgoingMessage(req.request_id, "error", exc)])

    def _free(self, life: Life) -> None:
        self._drop_state(life)
        self._ledger.end(life)

    def _drop_state(self, life: Life) -> None:
        req = self._requests.get(life.request_id)
        if req is not None and req.life is life:
            del self._requests[life.request_id]
            self.kv.remove(life.request_id)


def create_talker_stage(
    *,
    model_dir: str | None = None,
    do_sample: bool = True,
    temperature: float = 0.9,
    top_k: int = 50,
    top_p: float = 1.0,
    repetition_penalty: float = 1.05,
    max_new_tokens: int = 4096,
    min_new_tokens: int = 0,
    frames_per_chunk: int = 1,
    max_batch_size: int = 16,
    default_speaker: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
) -> TalkerScheduler:
    """The talker stage for the checkpoint in ``model_dir`` (loads ``talker.`` weights and 3 thinker rows).

    The sampling knobs are ``generate``'s ``talker_*`` arguments and defaults; a request's
    ``talker`` options (the thinker's prompt chunk) override them.  ``do_sample=False`` is greedy
    for the talker and the code predictor.  ``device``/``dtype`` place the talker and its code predictor,
    which runs in this stage (:mod:`schedulers.devices`); chunks arrive on the CPU, codes go out on the CPU.
    """
    from schedulers.qwen3_omni.talker.warm_up import talker_warm_up

    placement = Placement.of("talker", device, dtype)
    sampling = TalkerSampling(
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
    )
    model_dir = require_model_dir(model_dir)
    model = TalkerModel.from_checkpoint(Path(model_dir), dtype=placement.dtype, device=str(placement.device))
    scheduler = TalkerScheduler(
        model,
        sampling=sampling,
        frames_per_chunk=frames_per_chunk,
        max_batch_size=max_batch_size,
        default_speaker=default_speaker,
        seed=seed,
    )
    scheduler.warm_up = talker_warm_up(scheduler)
    return scheduler


create_talker_stage.preflight = preflight  # type: ignore[attr-defined]
