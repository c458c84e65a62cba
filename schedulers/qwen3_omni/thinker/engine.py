"""Continuous batching for the thinker: requests join and leave between steps; one forward decodes them all.

Each :meth:`ThinkerEngine.step` does, in order:

1. **decode**: one token for every running request, in one batched forward over the engine layer's
   :class:`~schedulers.engine.kv_batch.KVBatch` (every row steps: its storage is read in place; a
   2-D attention mask, each row's own text and rope positions);
2. **admit**: waiting requests (FIFO, up to ``max_running``) are prefilled one by one (batch 1) straight
   into a new row of the batch, which yields their first token;
3. **retire**: a request that produced ``eos_token_id`` (``"stop"``) or its ``max_new_tokens``-th token
   (``"length"``) leaves the batch; its keys/values are dropped at once.

The events of a step come in that order: per request, a :class:`Prefilled` event before its first
:class:`Token`, tokens in generation order, and the last one carries ``finish_reason``.  :meth:`abort`
takes effect at once (the request's row leaves the batch; no event follows).  A prefill that raises
fails that request alone (:class:`Failed`); a decode forward that raises fails every running request.

transformers' own continuous batching (``generate_batch`` / ``ContinuousBatchingManager``) takes token ids
and 1-D packed positions only: no ``inputs_embeds`` with audio/image features scattered in, no deepstack,
no 3-D rope positions with a per-request delta, so it cannot run this model.  The engine layer
(:mod:`schedulers.engine`) gives the KV batch, which drives transformers' model through its ``Cache``
interface, and the admission (:class:`~schedulers.engine.admission.Admission`: :meth:`ThinkerEngine.add`
raises its errors).

Not thread-safe: the scheduler's thread owns it.
"""

from __future__ import annotations

import collections

import attrs
import torch

from schedulers.engine.admission import Admission, FinishReason
from schedulers.engine.kv_batch import KVBatch
from schedulers.qwen3_omni.thinker.model import PromptInputs, ThinkerLM
from schedulers.qwen3_omni.thinker.sampling import Sampler


@attrs.define(eq=False)
class ThinkerRequest:
    """One generation: ``prompt`` from :meth:`ThinkerLM.prompt_inputs`; ``eos_token_id=None`` never stops early."""

    request_id: str
    prompt: PromptInputs
    max_new_tokens: int
    sampler: Sampler
    eos_token_id: int | None
    want_hidden: bool = True  # the Prefilled event carries the accept-layer states (the talker needs them)


@attrs.frozen
class Prefilled:
    """A request was prefilled: its input embeddings are ``prompt.embeds``, ``hidden`` its accept-layer states
    (None unless the request asked for them)."""

    request_id: str
    prompt: PromptInputs
    hidden: torch.Tensor | None


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


Event = Prefilled | Token | Failed


@attrs.define(eq=False)
class _Running:
    request: ThinkerRequest
    output_ids: list[int] = attrs.field(factory=list)
    next_embed: torch.Tensor | None = None  # the last output's embedding, fed at the next step

    def seen(self) -> list[int]:
        return self.request.prompt.input_ids.tolist() + self.output_ids


class ThinkerEngine:
    """The thinker's step loop state; see the module docstring."""

    def __init__(self, lm: ThinkerLM, *, max_running: int = 16, max_waiting: int = 256) -> None:
        self.admission = Admission(
            "thinker", context_tokens=int(lm.text_config.max_position_embeddings), max_running=max_running,
            max_waiting=max_waiting, vocab_size=lm.vocab_size,
        )  # fmt: skip
        self.lm = lm
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.kv: KVBatch[str] = KVBatch(lm.text_config.num_hidden_layers, device=lm.device, rows=max_running)
        self.waiting: collections.OrderedDict[str, ThinkerRequest] = collections.OrderedDict()
        self.running: dict[str, _Running] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def live_requests(self) -> int:
        """Requests waiting or decoding here."""
        return len(self.waiting) + len(self.running)

    def add(self, request: ThinkerRequest) -> None:
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

    def _prefill(self, request: ThinkerRequest, events: list[Event]) -> None:
        rid = request.request_id
        self.kv.add(rid)
        step = self.kv.step([rid], tokens=int(request.prompt.input_ids.numel()))
        done = self.lm.prefill(request.prompt, hidden=request.want_hidden, cache=step.cache)
        state = _Running(request)
        self.running[rid] = state
        events.append(Prefilled(rid, request.prompt, done.hidden))
        self._advance([state], done.logits[None], events)

    def _decode(self, events: list[Event]) -> None:
        rows = self.kv.rows
        states = [self.running[rid] for rid in rows]
        embeds = torch.cat([s.next_embed for s in states if s.next_embed is not None])
        deltas = [s.request.prompt.rope_delta for s in states]
        step = self.kv.step(rows)
        try:
            logits = self.lm.decode(embeds, step.lengths, deltas, step.attention_mask(), step.cache)
        except Exception as exc:  # the batch's forward failed: every request in it fails
            for state in states:
                self.abort(state.request.request_id)
                events.append(Failed(state.request.request_id, exc))
            return
        self._advance(states, logits, events)

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
