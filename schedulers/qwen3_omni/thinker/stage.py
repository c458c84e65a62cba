"""The thinker stage: continuous-batching decode of many requests, streaming to the text decode and the talker.

A ``new_request`` payload's data is what the aggregate stage sends (``/work/wt/OMNI.md``)::

    {"input_ids": Long[P] | list[int], "audio_embeds": Float[Na, H] | None, "image_embeds": Float[Ni, H] | None,
     "deepstack_image_embeds": list[Float[Ni, H]] | None, "image_grid_thw": Long[k, 3] | None,
     "audio_feature_lengths": Long[k] | None (mel frames per clip), "max_new_tokens": int | None,
     "temperature": float | None, "speaker": str | None, "talker": dict | None, "want_audio": bool}

What the scheduler sends, per request, in this order:

* to ``talker_target``, only when ``want_audio``: first ``{"kind": "prompt", "token_ids": Long[P], "embeds":
  Float[P, H], "hidden": Float[P, H], "speaker", "talker", "want_audio", "image_grid_thw",
  "audio_feature_lengths"}`` (``embeds`` is ``hidden_states[0]`` of the prompt, ``hidden`` the state at
  ``talker_config.accept_hidden_layer``, both as ``generate`` computes them), then per token
  ``{"kind": "token", "token_ids": Long[1], "embeds": Float[1, H]}`` as soon as it is chosen;
* to ``decode_target``, per token: ``{"kind": "token", "token_ids": [id], "want_audio": bool}``;
* the ``result``: the payload with ``data = {"token_ids": list[int] (eos included), "prompt_len",
  "finish_reason": "stop" | "length", "usage": {"prompt_tokens", "completion_tokens"}, "speaker",
  "want_audio", "talker"}``.

At the pipeline's entry the same dict arrives as ``{"raw_inputs": ...}`` and is read from there.

A request's ``max_new_tokens`` is capped at the stage's ``max_new_tokens`` (and defaults to it) and at
what the context (``max_position_embeddings``) leaves after the prompt; a prompt that fills it fails
with ``InvalidRequest`` (``context_length_exceeded``).  Bad inputs fail only that request (an ``error``
naming the field); ``abort`` drops the request and its keys/values before the next step.
:attr:`ThinkerScheduler.live_requests` and :attr:`ThinkerScheduler.kv_bytes` say what the stage holds now.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage, StagePayload
from schedulers.ar.step_loop import StepLoop
from schedulers.devices import Placement
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir
from schedulers.qwen3_omni.thinker.engine import Event, Failed, Prompt, ThinkerEngine, ThinkerRequest, Token
from schedulers.qwen3_omni.thinker.sampling import Sampler, SamplingDefaults


@attrs.define(eq=False)
class _Live:
    payload: StagePayload
    want_audio: bool
    speaker: str | None
    talker: dict[str, Any] | None
    image_grid_thw: torch.Tensor | None
    audio_feature_lengths: torch.Tensor | None
    prompt_len: int
    output_ids: list[int] = attrs.field(factory=list)


def _tensor(data: dict[str, Any], key: str, dtype: torch.dtype) -> torch.Tensor | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        return torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"thinker input {key!r}: {exc}") from None


def _plain(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU copy a consumer may keep and use anywhere (not an inference-mode tensor, not a view)."""
    if tensor is None:
        return None
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype, copy=True)


class ThinkerScheduler(StepLoop):
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

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                try:
                    request, live = self._parse(rid, message.data)
                    self.engine.add(request)
                except Exception as exc:  # a payload this stage cannot serve fails that request alone
                    self._outbox.put(OutgoingMessage(rid, "error", exc))
                    return
                self._live[rid] = live
            case "abort":
                self.engine.abort(rid)
                self._live.pop(rid, None)
            case "stream_chunk" | "stream_done":
                self.engine.abort(rid)
                self._live.pop(rid, None)
                self._refuse_stream(message)

    def _parse(self, rid: str, payload: Any) -> tuple[ThinkerRequest, _Live]:
        if not isinstance(payload, StagePayload) or not isinstance(payload.data, dict):
            raise ValueError(f"thinker: request {rid!r} needs a StagePayload whose data is a dict")
        data = payload.data
        if "input_ids" not in data and isinstance(data.get("raw_inputs"), dict):  # the pipeline's entry stage
            data = data["raw_inputs"]
        ids = _tensor(data, "input_ids", torch.long)
        if ids is None or ids.numel() == 0:
            raise ValueError(f"thinker: request {rid!r} has no input_ids")
        asked = data.get("max_new_tokens")
        if asked is not None and int(asked) < 1:
            raise InvalidRequest(f"max_tokens={asked} must be >= 1", param="max_tokens")
        temperature = data.get("temperature")
        if temperature is not None and float(temperature) < 0:
            raise InvalidRequest(f"temperature={temperature} must be >= 0", param="temperature")
        grid = _tensor(data, "image_grid_thw", torch.long)
        lengths = _tensor(data, "audio_feature_lengths", torch.long)
        deepstack = data.get("deepstack_image_embeds")
        prompt = self.engine.lm.prompt_inputs(
            ids,
            audio_embeds=_tensor(data, "audio_embeds", torch.float32),
            image_embeds=_tensor(data, "image_embeds", torch.float32),
            deepstack_image_embeds=None if deepstack is None else [torch.as_tensor(d) for d in deepstack],
            image_grid_thw=grid,
            audio_feature_lengths=lengths,
        )
        context = int(self.engine.lm.text_config.max_position_embeddings)
        room = context - int(prompt.input_ids.numel())
        if room < 1:
            raise InvalidRequest(
                f"the prompt has {prompt.input_ids.numel()} tokens; the thinker's context is {context}",
                code="context_length_exceeded",
                param="messages",
            )
        limit = min(int(asked) if asked is not None else self.max_new_tokens, self.max_new_tokens, room)
        sampler = Sampler.build(self.sampling, None if temperature is None else float(temperature), self._seed(rid))
        want_audio = bool(data.get("want_audio", False))
        request = ThinkerRequest(rid, prompt, limit, sampler, self.eos_token_id, want_hidden=want_audio)
        talker = data.get("talker")
        live = _Live(
            payload,
            want_audio,
            data.get("speaker"),
            dict(talker) if isinstance(talker, dict) else None,
            grid,
            lengths,
            int(prompt.input_ids.numel()),
        )
        return request, live

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
            case Prompt(prompt=prompt, hidden=hidden):
                if not live.want_audio:
                    return []
                chunk = {
                    "kind": "prompt",
                    "token_ids": _plain(prompt.input_ids),
                    "embeds": _plain(prompt.embeds),
                    "hidden": _plain(hidden),
                    "speaker": live.speaker,
                    "talker": live.talker,
                    "want_audio": True,
                    "image_grid_thw": live.image_grid_thw,
                    "audio_feature_lengths": live.audio_feature_lengths,
                }
                return [self._stream(rid, self.talker_target, chunk, "thinker")]
            case Token(token_id=token, embed=embed, finish_reason=reason):
                live.output_ids.append(token)
                text = {"kind": "token", "token_ids": [token], "want_audio": live.want_audio}
                outputs = [self._stream(rid, self.decode_target, text, "tokens")]
                if live.want_audio:
                    voice = {"kind": "token", "token_ids": torch.tensor([token]), "embeds": _plain(embed)}
                    outputs.append(self._stream(rid, self.talker_target, voice, "thinker"))
                if reason is not None:
                    del self._live[rid]
                    outputs.append(OutgoingMessage(rid, "result", self._result(live, reason)))
                return outputs
        return []

    @staticmethod
    def _stream(rid: str, target: str, data: dict[str, Any], modality: str) -> OutgoingMessage:
        return OutgoingMessage(rid, "stream", data, target=target, metadata={"modality": modality})

    @staticmethod
    def _result(live: _Live, reason: str) -> StagePayload:
        payload = live.payload
        payload.data = {
            "token_ids": list(live.output_ids),
            "prompt_len": live.prompt_len,
            "finish_reason": reason,
            "usage": {"prompt_tokens": live.prompt_len, "completion_tokens": len(live.output_ids)},
            "speaker": live.speaker,
            "want_audio": live.want_audio,
            "talker": live.talker,
        }
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
    return ThinkerScheduler(
        engine,
        eos_token_id=eos,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        decode_target=decode_target,
        talker_target=talker_target,
        seed=seed,
    )


create_thinker_stage.preflight = preflight  # type: ignore[attr-defined]
