"""A decoder as a stage: continuous batching (:mod:`.decoder`) behind the inbox/outbox, a family's handoffs out.

A ``new_request``'s payload is read by the family (:meth:`DecoderFamily.read`: its own input class, the
prompt its model builds, the request's knobs).  Then, per request, in this order: what the family makes
of the :class:`~.decoder.Prefilled`, :class:`~.decoder.Forwarded` and :class:`~.decoder.Token` events
(stream chunks to the targets it names, in the order the events come), and the ``result``: the payload
with the family's result as its data (:meth:`DecoderFamily.result`).

A request's ``max_new_tokens`` is capped at the stage's ``max_new_tokens`` and must fit beside the prompt
in the context (``max_position_embeddings``); a request that does not say gets the stage's
``max_new_tokens`` or what the context leaves, whichever is less.  A request that does not fit fails with
``InvalidRequest`` (``context_length_exceeded``, :mod:`schedulers.engine.admission`), so does a negative
``temperature``.  Bad inputs fail only that request (an ``error`` naming the field); ``abort`` drops the
request and its keys/values before the next step.  The sampling is :mod:`.sampling`'s, under the
request's seed (the family says which).  :attr:`DecoderScheduler.live_requests` and
:attr:`DecoderScheduler.kv_bytes` say what the stage holds now.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, overload

import attrs
import torch

from omnitrio.contract import InvalidRequest, OutgoingMessage, StagePayload
from schedulers.engine.admission import FinishReason, completion_budget
from schedulers.engine.decoder import Decoder, DecoderPrompt, DecoderRequest, Event, Failed, Forwarded, Prefilled, Token
from schedulers.engine.intake import EngineIntake
from schedulers.engine.sampling import Sampler, SamplingDefaults
from schedulers.warm_up import WarmUp

_T = TypeVar("_T", bound="_HasInputIds")


@attrs.frozen(eq=False)
class Ask:
    """What a family read from one request: the ``prompt`` its model built, the client's
    ``max_new_tokens`` / ``temperature`` (None: the stage's default), the sampler's ``seed`` (None: the
    global generator's), whether the prefill's states are wanted, and ``given``, the family's own input,
    handed back to its hooks."""

    prompt: DecoderPrompt
    given: Any
    max_new_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    want_hidden: bool = False


@attrs.frozen
class Send:
    """A stream chunk for ``target``: ``data``, tagged ``modality``."""

    target: str
    data: Any
    modality: str


@attrs.frozen
class Targets:
    """What a thinker family's hook is configured with: the stages its text and talker chunks go to, and
    the stage's ``seed`` (requests without their own draw theirs from it: :func:`request_seed`)."""

    decode_target: str = "decode"
    talker_target: str = "talker"
    seed: int | None = None


class DecoderFamily(Protocol):
    """A family's half of the stage: how it reads a request and what it hands on."""

    def read(self, request_id: str, payload: Any, lm: Any) -> Ask:
        """Parse the payload and build the prompt with ``lm``; raise to fail the request."""
        ...

    def prefilled(self, ask: Ask, prompt: DecoderPrompt, hidden: torch.Tensor | None) -> list[Send]: ...

    def forwarded(self, ask: Ask, hidden: torch.Tensor, embed: torch.Tensor) -> list[Send]: ...

    def token(self, ask: Ask, token_id: int, embed: torch.Tensor) -> list[Send]: ...

    def result(self, ask: Ask, token_ids: tuple[int, ...], prompt_len: int, reason: FinishReason) -> Any:
        """The result payload's data."""
        ...


class _HasInputIds(Protocol):
    @property
    def input_ids(self) -> torch.Tensor: ...


def entry_input(stage: str, request_id: str, payload: Any, cls: type[_T]) -> _T:
    """The payload's data as ``cls`` (at the pipeline's entry, its ``{"raw_inputs": ...}``) with at least one
    of its ``input_ids``; else ``ValueError`` naming ``stage``."""
    data = payload.data if isinstance(payload, StagePayload) else None
    if isinstance(data, dict) and "raw_inputs" in data:
        data = data["raw_inputs"]
    if not isinstance(data, cls):
        raise ValueError(f"{stage}: request {request_id!r} needs a {cls.__name__}, got {type(data).__name__}")
    if data.input_ids.numel() == 0:
        raise ValueError(f"{stage}: request {request_id!r} has no input_ids")
    return data


def request_seed(stage_seed: int | None, request_id: str) -> int | None:
    """A request's own seed drawn from the stage's (None: None), the same for the same id."""
    return None if stage_seed is None else zlib.crc32(f"{stage_seed}:{request_id}".encode())


@overload
def plain(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor: ...
@overload
def plain(tensor: None, dtype: torch.dtype | None = None) -> None: ...
def plain(tensor: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """A CPU copy a consumer may keep and use anywhere (not an inference-mode tensor, not a view), in
    ``dtype`` (None: its own)."""
    if tensor is None:
        return None
    return tensor.detach().to("cpu", dtype or tensor.dtype, copy=True)


def decoder_warm_up(engine: Decoder[Any], prompt: DecoderPrompt, *, tokens: int = 2) -> WarmUp:
    """A warm-up step ``"prefill and decode"``: ``prompt`` prefilled and ``tokens`` greedy tokens decoded
    through ``engine``'s KV batch (the first forwards' one-time costs), before any request: nothing of it
    stays in the engine."""

    def run() -> None:
        rid = "\x00warm-up"
        engine.add(DecoderRequest(rid, prompt, tokens, Sampler.build(SamplingDefaults(), 0.0), None, want_hidden=True))
        try:
            for _ in range(tokens):
                engine.step()
        finally:
            engine.abort(rid)

    return WarmUp().step("prefill and decode", run)


@attrs.define(eq=False)
class _Live:
    payload: StagePayload
    ask: Ask
    prompt_len: int
    output_ids: list[int] = attrs.field(factory=list)


class DecoderScheduler(EngineIntake[Decoder[Any], _Live]):
    """Serves a :class:`~.decoder.Decoder` through the inbox/outbox for a family (module docstring)."""

    def __init__(
        self,
        engine: Decoder[Any],
        family: DecoderFamily,
        *,
        eos_token_id: int | None,
        max_new_tokens: int = 1024,
        sampling: SamplingDefaults | None = None,
        on_step: Callable[[int], None] | None = None,
        warm_up: WarmUp | None = None,
    ) -> None:
        super().__init__()
        self.warm_up = warm_up or WarmUp()
        self.engine = engine
        self.family = family
        self.eos_token_id = eos_token_id
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or SamplingDefaults()
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

    def _parse(self, rid: str, payload: Any) -> tuple[DecoderRequest, _Live]:
        ask = self.family.read(rid, payload, self.engine.lm)
        prompt_len = int(ask.prompt.input_ids.numel())
        temperature = ask.temperature
        if temperature is not None and float(temperature) < 0:
            raise InvalidRequest(f"temperature={temperature} must be >= 0", param="temperature")
        limit = completion_budget(
            prompt_len,
            None if ask.max_new_tokens is None else int(ask.max_new_tokens),
            context=self.engine.admission.context_tokens,
            default=self.max_new_tokens,
            cap=self.max_new_tokens,
        )
        sampler = Sampler.build(self.sampling, None if temperature is None else float(temperature), ask.seed)
        request = DecoderRequest(rid, ask.prompt, limit, sampler, self.eos_token_id, want_hidden=ask.want_hidden)
        return request, _Live(payload, ask, prompt_len)

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
        sends: list[Send] = []
        match event:
            case Failed(error=error):
                del self._live[rid]
                return [OutgoingMessage(rid, "error", error)]
            case Prefilled(prompt=prompt, hidden=hidden):
                sends = self.family.prefilled(live.ask, prompt, hidden)
            case Forwarded(hidden=hidden, embed=embed):
                sends = self.family.forwarded(live.ask, hidden, embed)
            case Token(token_id=token, embed=embed, finish_reason=reason):
                live.output_ids.append(token)
                sends = self.family.token(live.ask, token, embed)
                if reason is not None:
                    del self._live[rid]
                    return [*self._stream(rid, sends), OutgoingMessage(rid, "result", self._result(live, reason))]
        return self._stream(rid, sends)

    @staticmethod
    def _stream(rid: str, sends: list[Send]) -> list[OutgoingMessage]:
        return [
            OutgoingMessage(rid, "stream", s.data, target=s.target, metadata={"modality": s.modality}) for s in sends
        ]

    def _result(self, live: _Live, reason: FinishReason) -> StagePayload:
        payload = live.payload
        payload.data = self.family.result(live.ask, tuple(live.output_ids), live.prompt_len, reason)
        return payload
