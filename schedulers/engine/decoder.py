"""Continuous batching of a decoder: requests join and leave between steps; one forward decodes them all.

Each :meth:`Decoder.step` does, in order:

1. **decode**: one token for every running request, in one batched forward over the engine layer's
   :class:`~schedulers.engine.kv_batch.KVBatch` (every row steps: its storage is read in place; a
   2-D attention mask, each row's own text and rope positions);
2. **admit**: waiting requests (FIFO, up to ``max_running``) are prefilled one by one (batch 1) straight
   into a new row of the batch, which yields their first token;
3. **retire**: a request that produced ``eos_token_id`` (``"stop"``) or its ``max_new_tokens``-th token
   (``"length"``) leaves the batch; its keys/values are dropped at once (its last token is never fed).

The events of a step come in that order: per request, a :class:`Prefilled` event before its first
:class:`Token`, tokens in generation order, and the last one carries ``finish_reason``.  When the model's
decode returns per-row states (:class:`Decoded` ``hidden``), a :class:`Forwarded` event for the token
just fed comes before the :class:`Token` that forward chose: every generated token but the last is
forwarded once, in order.  :meth:`abort` takes effect at once (the request's row leaves the batch; no event
follows).  A prefill that raises fails that request alone (:class:`Failed`); a decode forward that
raises fails every running request.

The model is any :class:`DecoderLM` (a family's wrapper of transformers' text model and head): it takes
input embeddings, per-row text lengths and rope deltas, and drives transformers' model through the KV
batch's ``Cache`` interface.  Admission is :class:`~schedulers.engine.admission.Admission`'s
(:meth:`Decoder.add` raises its errors).

Not thread-safe: the scheduler's thread owns it.
"""

from __future__ import annotations

import collections
from typing import Any, Generic, Protocol, TypeVar

import attrs
import torch
from torch import Tensor
from transformers.cache_utils import Cache

from schedulers.engine.admission import Admission, FinishReason
from schedulers.engine.kv_batch import KVBatch
from schedulers.engine.sampling import Sampler


class DecoderPrompt(Protocol):
    """One request's prompt as its model built it: ids ``Long[P]``, input embeddings ``Float[P, H]`` and the
    rope delta a decoded token adds to its text position."""

    @property
    def input_ids(self) -> torch.Tensor: ...
    @property
    def embeds(self) -> torch.Tensor: ...
    @property
    def rope_delta(self) -> int: ...


class PrefillOut(Protocol):
    """A prefill's outcome: the last position's logits ``[V]`` and the per-position states a family hands
    on (None when not asked for)."""

    @property
    def logits(self) -> torch.Tensor: ...
    @property
    def hidden(self) -> torch.Tensor | None: ...


@attrs.frozen(eq=False)
class Decoded:
    """A decode step's outcome: ``logits`` ``[B, V]``, and per row the state of the token fed (``hidden``
    ``[B, H]``, None when the family hands none on)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class DecoderLM(Protocol):
    """What the decoder needs of a family's model wrapper."""

    @property
    def text_config(self) -> Any: ...  # max_position_embeddings, num_hidden_layers
    @property
    def vocab_size(self) -> int: ...
    @property
    def device(self) -> torch.device: ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., H]``."""
        ...

    def prefill(self, prompt: Any, *, hidden: bool, cache: Cache) -> PrefillOut:
        """One prompt (batch 1) into ``cache`` (one empty row); ``hidden``: also the states to hand on."""
        ...

    def decode(self, embeds: Tensor, lengths: list[int], rope_deltas: list[int], mask: Tensor, cache: Cache) -> Decoded:
        """One token for each row: ``embeds`` ``[B, H]``, ``lengths[b]`` tokens already in row b's cache,
        ``mask`` the attention mask ``[B, width + 1]``."""
        ...


LM = TypeVar("LM", bound=DecoderLM)


@attrs.define(eq=False)
class DecoderRequest:
    """One generation: ``prompt`` from the model's ``prompt_inputs``; ``eos_token_id=None`` never stops early."""

    request_id: str
    prompt: DecoderPrompt
    max_new_tokens: int
    sampler: Sampler
    eos_token_id: int | None
    want_hidden: bool = True  # the Prefilled event carries the model's states (a talker needs them)


@attrs.frozen
class Prefilled:
    """A request was prefilled: its input embeddings are ``prompt.embeds``, ``hidden`` the model's states
    (None unless the request asked for them)."""

    request_id: str
    prompt: DecoderPrompt
    hidden: torch.Tensor | None


@attrs.frozen
class Forwarded:
    """The request's last token went through the model: its state ``hidden`` ``[H]`` and input embedding
    ``embed`` ``[1, H]`` (only for a model whose decode returns states)."""

    request_id: str
    hidden: torch.Tensor
    embed: torch.Tensor


@attrs.frozen
class Token:
    """One generated token and its input embedding ``[1, H]``; ``finish_reason`` on the last one."""

    request_id: str
    token_id: int
    embed: torch.Tensor
    finish_reason: FinishReason | None = None


@attrs.frozen
class Failed:
    request_id: str
    error: Exception


Event = Prefilled | Forwarded | Token | Failed


@attrs.define(eq=False)
class _Running:
    request: DecoderRequest
    output_ids: list[int] = attrs.field(factory=list)
    next_embed: torch.Tensor | None = None  # the last output's embedding, fed at the next step

    def seen(self) -> list[int]:
        return self.request.prompt.input_ids.tolist() + self.output_ids


class Decoder(Generic[LM]):
    """The decoder's step loop state over the model ``lm``; see the module docstring.  ``name`` names it in
    admission errors."""

    def __init__(self, lm: LM, *, name: str = "thinker", max_running: int = 16, max_waiting: int = 256) -> None:
        self.admission = Admission(
            name, context_tokens=int(lm.text_config.max_position_embeddings), max_running=max_running,
            max_waiting=max_waiting, vocab_size=lm.vocab_size,
        )  # fmt: skip
        self.lm = lm
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.kv: KVBatch[str] = KVBatch(lm.text_config.num_hidden_layers, device=lm.device, rows=max_running)
        self.waiting: collections.OrderedDict[str, DecoderRequest] = collections.OrderedDict()
        self.running: dict[str, _Running] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def live_requests(self) -> int:
        """Requests waiting or decoding here."""
        return len(self.waiting) + len(self.running)

    def add(self, request: DecoderRequest) -> None:
        """Queue a request; raises the admission's errors (a bad or too long request, a full queue)."""
        rid = request.request_id
        self.admission.check(
            rid, request.prompt.input_ids.tolist(), request.max_new_tokens,
            present=rid in self.waiting or rid in self.running, waiting=len(self.waiting), running=len(self.running),
        )  # fmt: skip
        self.waiting[rid] = request

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is (its keys/values at once); True when it was here."""
        if self.waiting.pop(request_id, None) is not None:
            return True
        removed = self.kv.remove(request_id)  # a prefill that failed has a row and no running state
        return self.running.pop(request_id, None) is not None or removed

    def step(self) -> list[Event]:
        """Decode, admit, retire (module docstring)."""
        events: list[Event] = []
        if self.running:
            self._decode(events)
        while self.waiting and len(self.running) < self.max_running:
            _, request = self.waiting.popitem(last=False)
            try:
                self._prefill(request, events)
            except Exception as exc:  # this request's inputs or its prefill failed; the others go on
                self.abort(request.request_id)
                events.append(Failed(request.request_id, exc))
        return events

    def _prefill(self, request: DecoderRequest, events: list[Event]) -> None:
        rid = request.request_id
        self.kv.add(rid)
        step = self.kv.step([rid], tokens=int(request.prompt.input_ids.numel()))
        done = self.lm.prefill(request.prompt, hidden=request.want_hidden, cache=step.cache)
        state = _Running(request)
        self.running[rid] = state
        events.append(Prefilled(rid, request.prompt, done.hidden if request.want_hidden else None))
        self._advance([state], done.logits[None], events)

    def _decode(self, events: list[Event]) -> None:
        rows = self.kv.rows
        states = [self.running[rid] for rid in rows]
        fed = [s.next_embed for s in states if s.next_embed is not None]
        deltas = [s.request.prompt.rope_delta for s in states]
        step = self.kv.step(rows)
        try:
            out = self.lm.decode(torch.cat(fed), step.lengths, deltas, step.attention_mask(), step.cache)
        except Exception as exc:  # the batch's forward failed: every request in it fails
            for state in states:
                self.abort(state.request.request_id)
                events.append(Failed(state.request.request_id, exc))
            return
        if out.hidden is not None:
            for state, hidden, embed in zip(states, out.hidden, fed, strict=True):
                events.append(Forwarded(state.request.request_id, hidden, embed))
        self._advance(states, out.logits, events)

    def _advance(self, states: list[_Running], logits: torch.Tensor, events: list[Event]) -> None:
        tokens = [
            s.request.sampler.choose(logits[row], s.seen() if s.request.sampler.processors else [])
            for row, s in enumerate(states)
        ]
        embeds = self.lm.embed(torch.tensor(tokens, dtype=torch.long)).unsqueeze(1)
        for state, token, embed in zip(states, tokens, embeds, strict=True):
            request = state.request
            state.output_ids.append(token)
            state.next_embed = embed
            reason: FinishReason | None = None
            if token == request.eos_token_id:
                reason = "stop"
            elif len(state.output_ids) >= request.max_new_tokens:
                reason = "length"
            if reason is not None:
                self.abort(request.request_id)
            events.append(Token(request.request_id, token, embed, reason))
