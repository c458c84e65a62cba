"""The thinker stage: continuous-batching decode of many requests, streaming to the text decode and the talker.

A ``new_request`` payload's data is the aggregate's :class:`~schedulers.qwen3_omni.handoffs.ThinkerInput`
(at the pipeline's entry, ``{"raw_inputs": ThinkerInput}``).  What the scheduler sends, per request, in
this order (the classes of :mod:`schedulers.qwen3_omni.handoffs`):

* to ``talker_target``, only when the answer is spoken: first a ``TalkerPrompt``, then a ``TalkerToken``
  per generated token as soon as it is chosen;
* to ``decode_target``, a ``DecodeToken`` per generated token;
* the ``result``: the payload with a ``ThinkerResult`` as its data.

A request's ``max_new_tokens`` is capped at the stage's ``max_new_tokens``, and must fit beside the
prompt in the context (``max_position_embeddings``); a request that does not say gets the stage's
``max_new_tokens`` or what the context leaves, whichever is less.  A request that does not fit fails
with ``InvalidRequest`` (``context_length_exceeded``, :mod:`schedulers.engine.admission`).  Bad inputs
fail only that request (an ``error`` naming the field); ``abort`` drops the request and its keys/values
before the next step.  :attr:`ThinkerScheduler.live_requests` and :attr:`ThinkerScheduler.kv_bytes` say
what the stage holds now.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

import attrs
import torch

from omnitrio.contract import InvalidRequest, OutgoingMessage, StagePayload
from schedulers.devices import Placement
from schedulers.engine.admission import completion_budget
from schedulers.engine.intake import RequestIntake
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen3_omni.handoffs import (
    DecodeToken,
    FinishReason,
    TalkerPrompt,
    TalkerToken,
    ThinkerInput,
    ThinkerResult,
)
from schedulers.qwen3_omni.thinker.engine import Event, Failed, Prefilled, ThinkerEngine, ThinkerRequest, Token
from schedulers.qwen3_omni.thinker.sampling import Sampler, SamplingDefaults


@attrs.define(eq=False)
class _Live:
    payload: StagePayload
    given: ThinkerInput
    prompt_len: int
    output_ids: list[int] = attrs.field(factory=list)

    @property
    def want_audio(self) -> bool:
        return self.given.knobs.want_audio


def _input_of(rid: str, payload: Any) -> ThinkerInput:
    data = payload.data if isinstance(payload, StagePayload) else None
    if isinstance(data, dict) and "raw_inputs" in data:  # the pipeline's entry stage
        data = data["raw_inputs"]
    if not isinstance(data, ThinkerInput):
        raise ValueError(f"thinker: request {rid!r} needs a ThinkerInput, got {type(data).__name__}")
    return data


@overload
def _plain(tensor: torch.Tensor) -> torch.Tensor: ...
@overload
def _plain(tensor: None) -> None: ...
def _plain(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU copy a consumer may keep and use anywhere (not an inference-mode tensor, not a view)."""
    if tensor is None:
        return None
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype, copy=True)


class ThinkerScheduler(RequestIntake):
    """Serves :class:`ThinkerEngine` through the inbox/outbox (module docstring)."""

    def __init__(
        self,
        engine: ThinkerEngine,
        *,
        eos_token_id: int | None,
        max_new_tokens: int = 1024,
        sampling: SamplingDefaults | None = None,
        decode_target: str = "decode",
        talker_target: str = "talker",
        seed: int | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or SamplingDefaults()
        self.decode_target = decode_target
        self.talker_target = talker_target
        self.seed = seed
        self.on_step = on_step
        self.steps = 0
        self._live: dict[str, _Live] = {}

    @property
    def live_requests(self) -> int:
        """Requests this stage holds now (waiting or decoding)."""
        return self.engine.live_requests

    @property
    def kv_bytes(self) -> int:
        """Bytes of keys/values the running requests hold now."""
        return self.engine.kv.nbytes()

    def _has_work(self) -> bool:
        return self.engine.has_work

    def _accept(self, request_id: str, data: Any) -> None:
        request, live = self._parse(request_id, data)
        self.engine.add(request)
        self._live[request_id] = live

    def _forget(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._live.pop(request_id, None)

    def _parse(self, rid: str, payload: Any) -> tuple[ThinkerRequest, _Live]:
        given = _input_of(rid, payload)
        if given.input_ids.numel() == 0:
            raise ValueError(f"thinker: request {rid!r} has no input_ids")
        asked = given.knobs.max_new_tokens
        temperature = given.knobs.temperature
        if temperature is not None and float(temperature) < 0:
            raise InvalidRequest(f"temperature={temperature} must be >= 0", param="temperature")
        deepstack = given.deepstack_image_embeds
        prompt = self.engine.lm.prompt_inputs(
            given.input_ids,
            audio_embeds=given.audio_embeds,
            image_embeds=given.image_embeds,
            deepstack_image_embeds=None if deepstack is None else list(deepstack),
            image_grid_thw=given.image_grid_thw,
            audio_feature_lengths=given.audio_feature_lengths,
        )
        limit = completion_budget(
            int(prompt.input_ids.numel()),
            None if asked is None else int(asked),
            context=self.engine.admission.context_tokens,
            default=self.max_new_tokens,
            cap=self.max_new_tokens,
        )
        sampler = Sampler.build(self.sampling, None if temperature is None else float(temperature), self._seed(rid))
        want_audio = given.knobs.want_audio
        request = ThinkerRequest(rid, prompt, limit, sampler, self.eos_token_id, want_hidden=want_audio)
        return request, _Live(payload, given, int(prompt.input_ids.numel()))

    def _seed(self, rid: str) -> int | None:
        return None if self.seed is None else zlib.crc32(f"{self.seed}:{rid}".encode())

    def _step(self) -> list[OutgoingMessage]:
        try:
            events = self.engine.step()
        except Exception as exc:  # the engine failed outside a forward: every request here fails, the stage lives
            failed = [*self.engine.running, *self.engine.waiting]
            for rid in failed:
                self.engine.abort(rid)
                self._live.pop(rid, None)
            return [OutgoingMessage(rid, "error", exc) for rid in failed]
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.steps)
        return [out for event in events for out in self._outputs(event)]

    def _outputs(self, event: Event) -> list[OutgoingMessage]:
        rid = event.request_id
        live = self._live.get(rid)
        if live is None:
            return []
        match event:
            case Failed(error=error):
                del self._live[rid]
                return [OutgoingMessage(rid, "error", error)]
            case Prefilled(prompt=prompt, hidden=hidden):
                if not live.want_audio or hidden is None:
                    return []
                given = live.given
                chunk = TalkerPrompt(
                    _plain(prompt.input_ids),
                    _plain(prompt.embeds),
                    _plain(hidden),
                    speaker=given.knobs.speaker,
                    talker=given.knobs.talker,
                    image_grid_thw=_plain(given.image_grid_thw),
                    audio_feature_lengths=_plain(given.audio_feature_lengths),
                )
                return [self._stream(rid, self.talker_target, chunk, "thinker")]
            case Token(token_id=token, embed=embed, finish_reason=reason):
                live.output_ids.append(token)
                outputs = [self._stream(rid, self.decode_target, DecodeToken(token, live.want_audio), "tokens")]
                if live.want_audio:
                    voice = TalkerToken(token, _plain(embed))
                    outputs.append(self._stream(rid, self.talker_target, voice, "thinker"))
                if reason is not None:
                    del self._live[rid]
                    outputs.append(OutgoingMessage(rid, "result", self._result(live, reason)))
                return outputs
        return []

    @staticmethod
    def _stream(rid: str, target: str, data: Any, modality: str) -> OutgoingMessage:
        return OutgoingMessage(rid, "stream", data, target=target, metadata={"modality": modality})

    @staticmethod
    def _result(live: _Live, reason: FinishReason) -> StagePayload:
        payload = live.payload
        payload.data = ThinkerResult(tuple(live.output_ids), live.prompt_len, reason, live.want_audio)
        return payload


def create_thinker_stage(
    *,
    model_dir: str | None = None,
    max_new_tokens: int = 1024,
    max_running_requests: int = 16,
    max_waiting_requests: int = 256,
    eos_token_id: int | None = None,
    decode_target: str = "decode",
    talker_target: str = "talker",
    seed: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> ThinkerScheduler:
    """Stage factory: the checkpoint's thinker text model and head (nothing else is read) in ``dtype`` on
    ``device`` (:mod:`schedulers.devices`), one torch CPU thread; the stage's outputs are CPU float32
    tensors wherever the model runs.

    ``eos_token_id`` defaults to the checkpoint's ``im_end_token_id`` (what ``generate``'s
    ``thinker_eos_token_id`` is for the released model); a request without a temperature samples as the
    checkpoint's ``generation_config.json`` says, greedy when it says nothing (:mod:`.sampling`)."""
    from transformers import GenerationConfig

    from schedulers.qwen3_omni.checkpoint import load_config, load_weights
    from schedulers.qwen3_omni.thinker.model import ThinkerLM
    from schedulers.qwen3_omni.thinker.warm_up import thinker_warm_up

    placement = Placement.of("thinker", device, dtype)
    torch.set_num_threads(1)
    model_dir = require_model_dir(model_dir)
    config = load_config(model_dir)
    load = functools.partial(load_weights, model_dir)
    lm = ThinkerLM.build(config, load, dtype=placement.dtype).to(placement.device)
    engine = ThinkerEngine(lm, max_running=max_running_requests, max_waiting=max_waiting_requests)
    eos = eos_token_id if eos_token_id is not None else int(config.im_end_token_id)
    generation = Path(model_dir) / "generation_config.json"
    sampling = SamplingDefaults.of(GenerationConfig.from_pretrained(model_dir) if generation.is_file() else None)
    scheduler = ThinkerScheduler(
        engine,
        eos_token_id=eos,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        decode_target=decode_target,
        talker_target=talker_target,
        seed=seed,
    )
    scheduler.warm_up = thinker_warm_up(scheduler)
    return scheduler


create_thinker_stage.preflight = preflight  # type: ignore[attr-defined]
