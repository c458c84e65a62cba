"""The continuous-batching decode engine: a waiting queue, one KV batch with a row per request, ``step()``.

Each :meth:`ARBatchEngine.step` does, in order:

1. **decode**: one token for every request that was already running, all in one batched forward;
2. **admit**: give waiting requests (FIFO) a row, up to ``max_running_requests``, and prefill
   them together in one forward, which yields their first token;
3. **retire**: requests that produced ``eos_token_id`` (finish ``"stop"``) or reached
   ``max_new_tokens`` (finish ``"length"``) leave and free their row for the next step.

So every running request gets exactly one token per step, and requests join and leave the batch at
step boundaries.

A request with a ``session_id`` keeps its row's keys/values when it leaves (finished or aborted):
that conversation's next request prefills only what it does not share with them, and a request's
first ``shared_prefix_len`` prompt tokens (a system prompt) are computed once for all requests
that start with them; :mod:`schedulers.ar.kv_sessions` holds those rules and their memory bound.

:meth:`abort` takes effect at once: the request leaves the waiting queue or its row is freed for
the next step's admission, and it never produces another token.

The keys/values are one :class:`~schedulers.engine.kv_batch.KVBatch` (the engine layer's), float32
whatever the weights' format (attention reads them without a conversion): ``layers * 2 * kv_heads *
head_dim * 4`` bytes a token, for at most ``max_running_requests + max_sessions`` rows as long as the
longest of them (with spare room).  The admission is the engine layer's
(:class:`~schedulers.engine.admission.Admission`).

The engine is not thread-safe: one thread (the scheduler's) owns it.  Requests beyond ``max_running_requests``
wait, at most ``max_waiting_requests`` of them; :meth:`add` raises
:class:`~omnitrio.contract.StageOverloaded` when that queue is full.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

import attrs
import torch

from schedulers.ar.kv_sessions import SessionCache
from schedulers.ar.model import TinyLlama
from schedulers.ar.sampling import Penalties, penalize, sample_rows
from schedulers.engine.admission import Admission
from schedulers.engine.kv_batch import KVBatch

FinishReason = str  # "stop" | "length"


@attrs.define(eq=False)
class GenerationRequest:
    """One generation: greedy when ``temperature == 0``; ``eos_token_id=None`` never stops early.

    ``seed`` fixes the request's own sampling generator (unseeded ones draw from the engine's).
    ``frequency_penalty``, ``presence_penalty`` (-2..2) and ``logit_bias`` ({token id: -100..100})
    adjust the logits before the choice, greedy or sampled (:func:`~schedulers.ar.sampling.penalize`)."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    eos_token_id: int | None = None
    temperature: float = 0.0
    return_hidden_states: bool = False
    top_p: float = 1.0
    seed: int | None = None
    session_id: str | None = None
    shared_prefix_len: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = attrs.field(factory=dict)

    @property
    def penalties(self) -> Penalties:
        return Penalties(self.frequency_penalty, self.presence_penalty, self.logit_bias)


@attrs.frozen
class TokenEvent:
    """One token of one request.  On the last one ``finish_reason`` is set and ``output_ids`` holds them all."""

    request_id: str
    token_id: int
    finish_reason: FinishReason | None = None
    output_ids: list[int] | None = None
    hidden_states: torch.Tensor | None = None  # [generated, dim] float32, on the last event, if asked


@attrs.frozen
class StepStats:
    """What one step did: ``batch_size`` is how many requests produced a token in it."""

    step: int
    prefilled: int
    decoded: int
    running: int
    waiting: int

    @property
    def batch_size(self) -> int:
        return self.prefilled + self.decoded


@attrs.define(eq=False)
class _Running:
    request: GenerationRequest
    length: int  # tokens whose keys/values are in its row
    output_ids: list[int] = attrs.field(factory=list)
    hidden: list[torch.Tensor] = attrs.field(factory=list)
    generator: torch.Generator | None = None

    def cached_tokens(self) -> list[int]:
        """The tokens whose keys/values are in its row (the last output has none yet)."""
        return (self.request.prompt_ids + self.output_ids)[: self.length]


class ARBatchEngine:
    """Continuous batching over a :class:`TinyLlama`; see the module docstring for the step order."""

    def __init__(
        self,
        model: TinyLlama,
        *,
        max_running_requests: int = 16,
        max_waiting_requests: int = 256,
        seed: int = 0,
        max_sessions: int = 0,
        max_prefixes: int = 8,
    ) -> None:
        self.admission = Admission(
            "AR engine", context_tokens=model.config.max_seq_len, max_running=max_running_requests,
            max_waiting=max_waiting_requests, vocab_size=model.config.vocab_size,
        )  # fmt: skip
        self.model = model
        self.config = model.config
        self.max_running_requests = max_running_requests
        self.max_waiting_requests = max_waiting_requests
        self.kv: KVBatch[Hashable] = KVBatch(model.config.n_layers, rows=max_running_requests + max_sessions)
        self.sessions = SessionCache(self.kv, max_sessions=max_sessions, max_prefixes=max_prefixes)
        self.waiting: collections.OrderedDict[str, GenerationRequest] = collections.OrderedDict()
        self.running: dict[str, _Running] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._steps = 0
        self.prefilled_tokens = 0  # prompt tokens computed
        self.reused_tokens = 0  # prompt tokens whose keys/values a session or shared prefix already had

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: GenerationRequest) -> None:
        """Queue a request; raises ``ValueError`` naming the bad field, or ``StageOverloaded`` when full."""
        rid = request.request_id
        vocab = self.config.vocab_size
        if request.temperature < 0:
            raise ValueError(f"request {rid!r}: temperature={request.temperature} must be >= 0")
        if not 0 < request.top_p <= 1:
            raise ValueError(f"request {rid!r}: top_p={request.top_p} must be in (0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(request, name) <= 2:
                raise ValueError(f"request {rid!r}: {name}={getattr(request, name)} must be in [-2, 2]")
        if any(not 0 <= t < vocab or not -100 <= b <= 100 for t, b in request.logit_bias.items()):
            raise ValueError(f"request {rid!r}: logit_bias needs token ids in [0, {vocab}) and biases in [-100, 100]")
        self.admission.check(
            rid, request.prompt_ids, request.max_new_tokens, present=rid in self.waiting or rid in self.running,
            waiting=len(self.waiting), running=len(self.running),
        )  # fmt: skip
        self.waiting[rid] = request

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; True when it was waiting or running."""
        if self.waiting.pop(request_id, None) is not None:
            return True
        state = self.running.pop(request_id, None)
        if state is None:
            return False
        self.sessions.release(request_id, state.request.session_id, state.cached_tokens())
        return True

    def step(self) -> tuple[list[TokenEvent], StepStats]:
        """Run one step (decode, admit + prefill, retire); see the module docstring."""
        events: list[TokenEvent] = []
        with torch.inference_mode():
            decoding = [self.running[rid] for rid in self.kv.order(self.running)]
            if decoding:
                tokens = torch.tensor([[s.output_ids[-1]] for s in decoding])
                step = self.kv.step([s.request.request_id for s in decoding])
                logits, hidden = self.model.forward(tokens, step)
                self._advance(decoding, logits[:, -1], hidden[:, -1], [1] * len(decoding), events)
            admitted = self._admit()
            for group in self._prefill_groups(admitted):
                self._prefill(group, events)
        self._steps += 1
        stats = StepStats(self._steps, len(admitted), len(decoding), len(self.running), len(self.waiting))
        return events, stats

    def _admit(self) -> list[_Running]:
        admitted = []
        while self.waiting and len(self.running) < self.max_running_requests:
            _, request = self.waiting.popitem(last=False)
            rid = request.request_id
            reused = self.sessions.claim(rid, request.session_id, request.prompt_ids, request.shared_prefix_len)
            generator = None if request.seed is None else torch.Generator().manual_seed(request.seed)
            state = _Running(request, reused, generator=generator)
            self.running[request.request_id] = state
            admitted.append(state)
            self.reused_tokens += reused
            self.prefilled_tokens += len(request.prompt_ids) - reused
        order = {rid: row for row, rid in enumerate(self.kv.order(s.request.request_id for s in admitted))}
        admitted.sort(key=lambda s: order[s.request.request_id])
        return admitted

    def _prefill_groups(self, admitted: list[_Running]) -> list[list[_Running]]:
        """One batch when every row starts at the same position, else one prefill per request."""
        if len({s.length for s in admitted}) <= 1:
            return [admitted] if admitted else []
        return [[s] for s in admitted]

    def _prefill(self, group: list[_Running], events: list[TokenEvent]) -> None:
        start = group[0].length
        todo = [s.request.prompt_ids[s.length :] for s in group]
        lengths = [len(ids) for ids in todo]
        width = max(lengths)
        padded = [ids + [0] * (width - len(ids)) for ids in todo]
        last = [n - 1 for n in lengths]
        rids = [s.request.request_id for s in group]
        logits, hidden = self.model.forward(torch.tensor(padded), self.kv.step(rids, tokens=width), logits_at=last)
        for rid, n in zip(rids, lengths, strict=True):
            self.kv.truncate(rid, start + n)  # the padding written past a shorter prompt is not its own
        for state in group:
            shared = state.request.shared_prefix_len
            if start == 0 and 0 < shared < len(state.request.prompt_ids):
                self.sessions.remember_prefix(state.request.request_id, state.request.prompt_ids[:shared])
        rows = torch.arange(len(group))
        self._advance(group, logits[:, 0], hidden[rows, torch.tensor(last)], lengths, events)

    def _advance(
        self,
        states: list[_Running],
        logits: torch.Tensor,
        hidden: torch.Tensor,
        consumed: list[int],
        events: list[TokenEvent],
    ) -> None:
        """Pick each row's next token, append it, and retire the finished."""
        next_tokens = self._sample(states, logits)
        for row, (state, token) in enumerate(zip(states, next_tokens, strict=True)):
            request = state.request
            state.length += consumed[row]
            state.output_ids.append(token)
            if request.return_hidden_states:
                state.hidden.append(hidden[row].float())
            reason: FinishReason | None = None
            if token == request.eos_token_id:
                reason = "stop"
            elif len(state.output_ids) >= request.max_new_tokens:
                reason = "length"
            if reason is None:
                events.append(TokenEvent(request.request_id, token))
                continue
            del self.running[request.request_id]
            self.sessions.release(request.request_id, request.session_id, state.cached_tokens())
            hidden_states = torch.stack(state.hidden) if request.return_hidden_states else None
            events.append(TokenEvent(request.request_id, token, reason, state.output_ids, hidden_states))

    def _sample(self, states: list[_Running], logits: torch.Tensor) -> list[int]:
        logits = penalize(logits, [s.request.penalties for s in states], [s.output_ids for s in states])
        return sample_rows(
            logits,
            [s.request.temperature for s in states],
            [s.request.top_p for s in states],
            [s.generator or self._generator for s in states],
        )
